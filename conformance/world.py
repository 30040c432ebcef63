"""A persistent world of replicas: host processes that run tasks on request.

A :class:`World` starts its host processes once (one per replica on the CPU
runtime; one per host with a thread per replica on PJRT), then runs many tasks
on them. Every wait is bounded: a task that does not finish within its timeout
gets every host's Python stacks dumped (``faulthandler`` on ``SIGUSR1``) and the
world killed; a host that dies is reported with its exit code and log tail; a
replica that raises is reported with its traceback. After any of these the world
is marked broken and must be replaced (:class:`WorldPool` does that).

Hosts ignore SIGINT (the parent owns Ctrl-C and kills them) and die with their
parent (``PR_SET_PDEATHSIG`` plus a watchdog thread), so no orphans remain.
Rendezvous uses a file in a private temporary directory, never a port, so many
worlds (pytest-xdist workers) coexist on one machine.

This module imports torch only inside host processes.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import traceback
from multiprocessing.connection import wait as wait_any

DEFAULT_TIMEOUT = float(os.environ.get("CONFORMANCE_TIMEOUT", 120))
START_TIMEOUT = float(os.environ.get("CONFORMANCE_START_TIMEOUT", 180))
# After one replica fails, how long the others get to finish before the world
# is declared stuck (they may be blocked in a collective the failed one left).
FAILURE_GRACE = 10.0
LOG_TAIL_LINES = 40


class ReplicaError(RuntimeError):
    """A task did not complete on every replica; the message names which and why."""


class ReplicaFailed(ReplicaError):
    """A replica raised; the message holds its traceback."""


class ReplicaTimeout(ReplicaError):
    """A replica did not answer in time; the message holds every host's stacks."""


class ReplicaDied(ReplicaError):
    """A host process exited; the message holds its exit code and log tail."""


def _tail(path, lines=LOG_TAIL_LINES):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _die_with_parent(parent_pid):
    try:  # Linux: the kernel kills us when the parent goes.
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    import threading

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(70)
    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def _host_main(runtime_name, host, world_size, conn, workdir, env, parent_pid):
    """Entry point of a host process (spawned; runs until told to stop)."""
    log_fd = os.open(os.path.join(workdir, f"host{host}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    import faulthandler
    stacks = open(os.path.join(workdir, f"host{host}.stacks"), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    os.environ.update(env)
    try:
        from .runtimes import get_runtime
        runtime = get_runtime(runtime_name)
        replicas = runtime.setup_host(host, world_size, workdir)
        conn.send(("ready", [r.rank for r in replicas]))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            break
        task_id, fn, payload = msg
        results = runtime.execute(replicas, fn, payload)
        conn.send(("done", task_id, results))
    runtime.teardown_host(replicas)


class World:
    """``world_size`` replicas of ``runtime``, started now and kept until :meth:`close`.

    Args:
        runtime: a runtime name from :data:`conformance.runtimes.RUNTIMES`.
        world_size: number of replicas (``>= 1``).
        timeout: default bound in seconds on each task (env ``CONFORMANCE_TIMEOUT``).

    Raises:
        ReplicaError: when the hosts cannot start within ``CONFORMANCE_START_TIMEOUT``.
        conformance.runtimes.RuntimeUnavailable: when the runtime cannot run here.
    """

    def __init__(self, runtime: str, world_size: int, timeout: float = DEFAULT_TIMEOUT):
        from .runtimes import get_runtime
        self.runtime = runtime
        self.world_size = world_size
        self.timeout = timeout
        self.broken = False
        adapter = get_runtime(runtime)
        adapter.check(world_size)
        self.workdir = tempfile.mkdtemp(prefix=f"ddpconf-{runtime}{world_size}-")
        ctx = mp.get_context("spawn")
        self.hosts = []
        try:
            for host, env in enumerate(adapter.host_envs(world_size)):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_host_main, daemon=True, name=f"{runtime}-host{host}",
                                   args=(runtime, host, world_size, child, self.workdir, env, os.getpid()))
                proc.start()
                child.close()
                self.hosts.append((proc, parent))
            self._ordinals = self._collect("ready", None, START_TIMEOUT)
        except BaseException:
            self.close()
            raise
        self._next_task = 0

    # --- running tasks ---------------------------------------------------
    def run(self, fn, timeout: float | None = None, **payload) -> list:
        """Run ``fn(ctx, **payload)`` on every replica; return results by global ordinal.

        ``fn`` must be a module-level function (it is pickled by reference);
        ``payload`` and results must be picklable (numpy, not tensors).

        Raises:
            ReplicaFailed / ReplicaTimeout / ReplicaDied: see the classes; the
                world is then broken.
        """
        if self.broken:
            raise ReplicaError(f"{self.describe()} is broken by an earlier failure")
        self._next_task += 1
        task = self._next_task
        for proc, conn in self.hosts:
            try:
                conn.send((task, fn, payload))
            except (BrokenPipeError, OSError):
                pass  # reported by _collect as a dead host
        per_host = self._collect("done", task, timeout or self.timeout)
        results = [None] * self.world_size
        errors = []
        for rows in per_host:
            for ordinal, ok, value in rows:
                if ok:
                    results[ordinal] = value
                else:
                    errors.append(f"--- replica {ordinal} raised:\n{value}")
        if errors:
            self._break()
            raise ReplicaFailed(f"{self.describe()}: {len(errors)} replica(s) raised\n" + "\n".join(errors))
        return results

    def _collect(self, kind, task, timeout):
        """Wait for one ``kind`` message from every host, bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        pending = {i: h for i, h in enumerate(self.hosts)}
        got = {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail_stuck(ReplicaTimeout, f"no answer within {timeout:.0f} s", pending)
            ready = wait_any([c for _, c in pending.values()] + [p.sentinel for p, _ in pending.values()],
                             timeout=left)
            for i, (proc, conn) in list(pending.items()):
                msg = None
                if conn in ready or conn.poll():
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        msg = None
                if msg is None:
                    if proc.sentinel in ready or not proc.is_alive():
                        proc.join(1)
                        why = (f"{self.describe()}: host {i} (pid {proc.pid}) exited with code "
                               f"{proc.exitcode}; log tail:\n{self.log_tail(i)}")
                        self._break()
                        raise ReplicaDied(why)
                    continue
                if msg[0] == "error":
                    self._break()
                    raise ReplicaFailed(f"{self.describe()}: host {i} failed to start:\n{msg[1]}")
                if msg[0] != kind or (task is not None and msg[1] != task):
                    continue  # a stale answer of an earlier task
                got[i] = msg[-1]
                del pending[i]
                if got and pending and kind == "done" and any(not ok for rows in got.values() for _, ok, _ in rows):
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
        return [got[i] for i in range(len(self.hosts))]

    def _fail_stuck(self, exc, why, pending):
        parts = [f"{self.describe()}: {why}; stuck host(s) {sorted(pending)}"]
        for proc, _ in self.hosts:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(1.0)
        for i in range(len(self.hosts)):
            parts.append(f"--- host {i} stacks:\n{_tail(os.path.join(self.workdir, f'host{i}.stacks'), 400)}")
            parts.append(f"--- host {i} log tail:\n{self.log_tail(i)}")
        self._break()
        raise exc("\n".join(parts))

    # --- lifecycle -------------------------------------------------------
    def describe(self) -> str:
        return f"{self.runtime} world of {self.world_size} replica(s)"

    def log_tail(self, host: int) -> str:
        return _tail(os.path.join(self.workdir, f"host{host}.log"))

    def pids(self) -> list[int]:
        return [p.pid for p, _ in self.hosts]

    def _break(self):
        self.broken = True
        self.close(graceful=False)

    def close(self, graceful: bool = True) -> None:
        """Stop every host (politely when ``graceful``, then by SIGKILL); idempotent."""
        for proc, conn in self.hosts:
            if graceful and proc.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + (5.0 if graceful else 0.0)
        for proc, conn in self.hosts:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
            conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)  # error reports are built before

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WorldPool:
    """Worlds keyed by ``(runtime, world_size)``, started on first use, replaced when broken."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self._worlds: dict[tuple[str, int], World] = {}

    def get(self, runtime: str, world_size: int) -> World:
        key = (runtime, world_size)
        world = self._worlds.get(key)
        if world is None or world.broken:
            world = self._worlds[key] = World(runtime, world_size, self.timeout)
        return world

    def close(self) -> None:
        for world in self._worlds.values():
            world.close()
            shutil.rmtree(world.workdir, ignore_errors=True)
        self._worlds.clear()
