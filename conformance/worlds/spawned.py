"""A persistent world of replicas: host processes that run tasks on request.

A :class:`World` starts its host processes once (one per replica on the CPU
runtime; one per host with a thread per replica on PJRT), then runs many tasks
on them. Every wait is bounded, and every failure is classified and diagnosed
per replica (:attr:`ReplicaError.diagnosis`). Long because the controller is one state
machine over its hosts (start, run a task, keep or replace the world after a failure, close);
the host loop, the stack helpers and the failure messages live in ``host``, ``stacks`` and
``failure``:

* a replica that raises reports its exception to the parent at once (the
  host sends it before the other replicas finish); the parent waits
  :data:`RAISE_GRACE` seconds for simultaneous failures (less once every other
  replica is seen inside a collective), then diagnoses:
  :class:`ReplicaFailed` names the replica(s) that raised, with type,
  message and traceback; replicas blocked in a collective it left are
  ``aborted-by-peer``. Where the runtime can (CPU), the world is then kept:
  the hosts drop their process groups, which ends those collectives, and
  rendezvous anew (:meth:`World._reset`);
* a host process that exits is :class:`ReplicaDied` with its exit code or
  signal, its Python stacks when the death was a fatal signal (``faulthandler``
  is enabled in every host: an abort by gloo or XLA dumps every thread), and
  what each replica was doing (step, phase, last collective);
* :class:`ReplicaTimeout` only when a bound really passed: the task's
  ``timeout``, or the runtime's *collective bound*
  (:attr:`conformance.worlds.runtimes.base.Runtime.collective_bound`): a replica that
  has waited that long inside a collective while a peer is elsewhere (still
  computing, or returned from the task) means that peer hung or skipped the
  collective. Both bounds are below the runtime's own collective timeout
  (gloo's error, raised above the task bound, see
  :func:`conformance.worlds.runtimes.cpu.process_group_timeout_s`; XLA's abort), so
  the report names the peer, not the waiter.

Who is to blame is decided from evidence (:func:`conformance.worlds.blame.blame`):
every replica's stacks (all threads), its progress, and the collective it is
inside - recorded by the kit, or found in its stack when the DDP under test
calls torch.distributed or torch_xla itself. A replica inside a collective is
``waiting``; the one elsewhere, behind, returned or dead is the culprit. The
message and the error class are built from that plain data by
:mod:`conformance.worlds.failure` (stack helpers: :mod:`conformance.worlds.stacks`);
the host processes run :mod:`conformance.worlds.host`.

Each replica's progress (task, step, phase, last collective; tasks add to it
with :meth:`ReplicaContext.note <conformance.worlds.runtimes.base.ReplicaContext.note>`)
lives in a shared file the parent reads after a failure
(:mod:`conformance.worlds.diagnosis`). After any other failure (or a reset that did not
complete) the world is broken and must be replaced (:class:`WorldPool` does that).

Hosts ignore SIGINT (the parent owns Ctrl-C: an interrupted :meth:`World.run`
kills the hosts) and die with their parent (``PR_SET_PDEATHSIG`` plus a
watchdog thread), so no orphans remain. Hosts drop the parent's launcher
variables (:data:`conformance.worlds.host.SCRUBBED_LAUNCHER_VARS`): a kit-spawned world is never part of a
torchrun launch it happens to be started from. Rendezvous uses a file in a
private temporary directory, never a port, so many worlds (pytest-xdist
workers) coexist on one machine.

This module imports torch only inside host processes.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from multiprocessing.connection import wait as wait_any

from conformance.settings import Settings
from conformance.worlds import registry
from conformance.worlds import blame as blame_mod, diagnosis as dg, procmem  # noqa: F401 (blame_mod: tests patch it)
# Also names other modules import from here (the exceptions, the host's helpers, _top_frame).
from conformance.worlds.failure import (HostDiedStarting, ReplicaDied, ReplicaError, ReplicaFailed,  # noqa: F401
                                        ReplicaTimeout, all_waiting, collective_hang, machine_load, progress_mark,
                                        replica_diagnosis, replica_error)
from conformance.worlds.hoststart import host_context
from conformance.worlds.host import (POLL_S, SCRUBBED_LAUNCHER_VARS, WATCH_S,  # noqa: F401
                                     die_with_parent as _die_with_parent, host_main,
                                     watch_collectives as _watch_collectives)
from conformance.worlds.runtimes import get_runtime
from conformance.worlds.stacks import crash_site, top_frame as _top_frame  # noqa: F401

# After the first replica raised (or a host died), how long the parent waits
# for other replicas' simultaneous reports before it tears the world down.
# Short: the others are most likely blocked in a collective the failed one left.
RAISE_GRACE = 2.0
# How often the parent reads the progress board while waiting: host.POLL_S.
# The grace ends early once every replica that has not reported is seen inside a collective
# (it cannot raise on its own before the runtime's timeout) at least this long after the
# first report: one stack sample of its host (every WATCH_S) taken since.
WAITING_SEEN_S = WATCH_S + 0.1
# A stack dump (faulthandler, written inside the host's signal handler) is read once its file
# has stopped growing for DUMP_STABLE_S and holds every replica thread, polled every DUMP_POLL_S.
DUMP_POLL_S, DUMP_STABLE_S = 0.02, 0.06
# Bound on making a world whole again after a raise (World._reset); past it, or on any
# error, the world is torn down and replaced as before. Measured ~0.1 s.
RESET_BOUND_S = 15.0
LOG_TAIL_LINES = 200
# Of a host's faulthandler dump in a start-up failure: a fatal signal's dump of every thread.
STACKS_TAIL_LINES = 120


def _tail(path, lines=LOG_TAIL_LINES):
    return dg.tail(path, lines)


class World:
    """``world_size`` replicas of ``runtime``, started now and kept until :meth:`close`.

    Args:
        runtime: a runtime name from :data:`conformance.worlds.runtimes.RUNTIMES`.
        world_size: number of replicas (``>= 1``).
        timeout: default bound in seconds on each task (default ``settings.replica_timeout``).
        settings: the run's :class:`~conformance.settings.Settings` (default: built-in defaults).
        wait: wait here for every host's start-up answer; ``False`` returns once the host
            processes are spawned (they import the runtime meanwhile) and the first :meth:`run`
            (or :meth:`wait_started`) waits, bounded by ``settings.start_timeout`` from then.

    Raises:
        ReplicaError: when the hosts cannot start within ``settings.start_timeout`` (with
            ``wait=False``: raised by :meth:`wait_started` / :meth:`run`).
        conformance.worlds.runtimes.RuntimeUnavailable: when the runtime cannot run here.
    """

    def __init__(self, runtime: str, world_size: int, timeout: float | None = None,
                 settings: Settings | None = None, wait: bool = True):
        settings = settings or Settings()
        if timeout:  # the hosts size gloo's timeout from the task bound (runtimes.cpu)
            settings = settings.replace(replica_timeout=timeout)
        self.settings = settings
        self.runtime = runtime
        self.world_size = world_size
        self.timeout = settings.replica_timeout
        self.broken = False
        self.hosts = []
        self._close_lock = threading.Lock()  # close() from two threads (lanes)
        adapter = get_runtime(runtime, settings)
        adapter.check(world_size)
        self.collective_bound = adapter.collective_bound
        self._progress = {}  # {task: {rank: (progress mark, time it last changed)}}
        self.workdir = tempfile.mkdtemp(prefix=f"ddpconf-{runtime}{world_size}-")
        self._board = os.path.join(self.workdir, "progress")
        dg.create_board(self._board, world_size)
        ctx = host_context(settings.host_start)
        # The host resolves the runtime in its own registry: one registered in this process
        # after the fork server started (a test's, a plugin's) travels with the host's arguments.
        name = registry.WorldKey.parse(runtime).runtime
        registered = (name, registry.RUNTIMES[name])
        try:
            for host, env in enumerate(adapter.host_envs(world_size)):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=host_main, daemon=True, name=f"{runtime}-host{host}",
                                   args=(runtime, host, world_size, child, self.workdir, env, os.getpid(), settings,
                                         dict(os.environ), registered))
                # Listed before start(): a Ctrl-C inside start() must not leave a started host
                # unkilled (multiprocessing's exit handler would SIGTERM and join it unbounded).
                self.hosts.append((proc, parent))
                proc.start()
                child.close()
        except BaseException:  # a host still starting reads no stop message: kill at once
            self.close(graceful=False)
            raise
        self._ranks, self._host_of = None, {}
        self._next_task, self._stop_sent = 0, False
        self._generation = 0  # of the hosts' rendezvous (World._reset)
        self.resets = 0  # failures this world survived (World._reset)
        self._resettable = adapter.resettable
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Wait (once) for every host's start-up answer, bounded by ``settings.start_timeout``.

        Raises:
            ReplicaError: a host failed, died or did not answer in time; the world is then
                broken and its hosts killed.
        """
        if self._ranks is not None:
            return
        if self.broken:
            raise ReplicaError(f"{self.describe()} is broken by an earlier failure")
        try:
            self._ranks = self._collect_ready(self.settings.start_timeout)
        except BaseException:  # a host still starting reads no stop message: kill at once
            self._break()
            raise
        self._host_of = {r: h for h, ranks in enumerate(self._ranks) for r in ranks}

    @property
    def started(self) -> bool:
        """Every host answered its start-up (see :meth:`wait_started`)."""
        return self._ranks is not None

    # --- running tasks ---------------------------------------------------
    def run(self, fn, timeout: float | None = None, **payload) -> list:
        """Run ``fn(ctx, **payload)`` on every replica; return results by global ordinal.

        ``fn`` must be a module-level function (it is pickled by reference);
        ``payload`` and results must be picklable (numpy, not tensors).

        Raises:
            ReplicaFailed / ReplicaTimeout / ReplicaDied: see the classes; the
                world is then broken, except after a raise it could reset
                (:meth:`_reset`; :attr:`resets` counts them). ``KeyboardInterrupt`` kills the hosts
                first, then propagates.
        """
        self.wait_started()
        if self.broken:
            raise ReplicaError(f"{self.describe()} is broken by an earlier failure")
        self._next_task += 1
        task = self._next_task
        try:
            for proc, conn in self.hosts:
                try:
                    conn.send((task, fn, payload))
                except (BrokenPipeError, OSError):
                    pass  # reported by _collect_task as a dead host
            from conformance.worlds.diagnosis import task_name
            results = self._collect_task(task, task_name(fn, payload), timeout or self.timeout)
        except ReplicaError:
            raise
        except BaseException:  # Ctrl-C or a bug here: never leave hosts running a task
            self._break()
            raise
        return results

    def _collect_ready(self, timeout):
        """Wait for every host's start-up answer (its ranks), bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        got = {}
        while len(got) < len(self.hosts):
            left = deadline - time.monotonic()
            pending = [i for i in range(len(self.hosts)) if i not in got]
            if left <= 0:
                self._dump_stacks([i for i in pending if self.hosts[i][0].is_alive()])
                message = (f"{self.describe()}: host(s) {pending} did not start within {timeout:.0f} s\n"
                           + self._logs(pending, stacks=True))
                self._break()
                raise ReplicaTimeout(message)
            ready = wait_any([self.hosts[i][1] for i in pending] + [self.hosts[i][0].sentinel for i in pending],
                             timeout=left)
            for i in pending:
                proc, conn = self.hosts[i]
                msg = None
                if conn in ready or conn.poll():
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        msg = None
                if msg is None:
                    if proc.sentinel in ready or not proc.is_alive():
                        proc.join(1)
                        code, sig = dg.exit_description(proc.exitcode)
                        death = f"host {i} (pid {proc.pid}) exited with code {code}{f' ({sig})' if sig else ''}"
                        message = f"{self.describe()}: {death} while starting\n" + self._logs([i], stacks=True)
                        where = crash_site(_read(self._stacks_path(i)))
                        self._break()  # removes the workdir: the logs are read above
                        raise HostDiedStarting(message, i, proc.exitcode, death, where)
                    continue
                if msg[0] == "error":
                    message = f"{self.describe()}: host {i} failed to start\n{msg[1]}" + self._logs([i])
                    self._break()
                    raise ReplicaFailed(message)
                got[i] = msg[1]
        return [got[i] for i in range(len(self.hosts))]

    def _stacks_path(self, host: int) -> str:
        """Where host ``host`` writes its ``faulthandler`` dumps (conformance.worlds.host)."""
        return os.path.join(self.workdir, f"host{host}.stacks")

    def _logs(self, hosts, stacks=False):
        """Each host's log tail; with ``stacks``, also its ``faulthandler`` dump (a fatal
        signal's, or the one :meth:`_dump_stacks` asked for), where a death while starting
        shows where it happened: that dump is all there is of a crash in C++ code."""
        out = []
        for i in hosts:
            out.append(f"\n--- host {i} log tail:\n{self.log_tail(i)}")
            dump = _tail(self._stacks_path(i), STACKS_TAIL_LINES) if stacks else ""
            if dump.strip():
                out.append(f"\n--- host {i} stacks (faulthandler):\n{dump}")
        return "".join(out)

    def _collect_task(self, task, name, timeout):
        """Wait for task ``task`` on every host; classify and raise on any failure."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        pending = set(range(len(self.hosts)))
        rows_by_host, raised, dead = {}, {}, {}
        failed_at = None
        hang = None
        while pending:
            now = time.monotonic()
            if failed_at is not None and now >= failed_at + RAISE_GRACE:
                break
            if (failed_at is not None and not dead and now >= failed_at + WAITING_SEEN_S
                    and (self._resettable or self._all_waiting(task, pending))):
                break  # a reset ends a peer's wait in the culprit's collective (World._reset)
            if now >= deadline:
                break
            if self.collective_bound is not None and failed_at is None:
                hang = self._collective_hang(task, pending, rows_by_host, now)
                if hang:
                    break
            limit = min(deadline, failed_at + RAISE_GRACE if failed_at is not None else deadline) - now
            # after a report, wake at each stack sample: the grace may end at the next one
            poll = POLL_S if failed_at is None else WATCH_S
            ready = wait_any([self.hosts[i][1] for i in pending] + [self.hosts[i][0].sentinel for i in pending],
                             timeout=max(0.0, min(poll, limit)))
            for i in sorted(pending):
                proc, conn = self.hosts[i]
                got_any = False
                while True:
                    try:
                        if not (conn in ready or conn.poll()):
                            break
                        msg = conn.recv()
                    except (EOFError, OSError):
                        break
                    ready = ()  # poll() from now on
                    got_any = True
                    if msg[0] == "raised" and msg[1] == task:
                        raised.setdefault(msg[2], msg[3])
                        failed_at = failed_at or time.monotonic()
                    elif msg[0] == "done" and msg[1] == task:
                        rows_by_host[i] = msg[2]
                        for rank, ok, value in msg[2]:
                            if not ok:
                                raised.setdefault(rank, value if isinstance(value, dict) else
                                                  {"exception_type": None, "traceback": str(value)})
                                failed_at = failed_at or time.monotonic()
                        pending.discard(i)
                        break
                if i in pending and not got_any and not proc.is_alive():
                    proc.join(1)
                    dead[i] = proc.exitcode
                    pending.discard(i)
                    failed_at = failed_at or time.monotonic()
        elapsed = time.monotonic() - t0
        if not raised and not dead and not pending:
            results = [None] * self.world_size
            for rows in rows_by_host.values():
                for rank, _, value in rows:
                    results[rank] = value
            return results
        self._fail(task, name, timeout, elapsed, pending, rows_by_host, raised, dead, hang)

    def _all_waiting(self, task, pending):
        """Every replica of the ``pending`` hosts is inside a collective of ``task``."""
        ranks = [r for r in range(self.world_size) if self._host_of.get(r, r) in pending]
        return all_waiting(dg.read_board(self._board, self.world_size), ranks, task)

    def _collective_hang(self, task, pending, rows_by_host, now):
        """:func:`conformance.worlds.failure.collective_hang` of the board now, each replica's
        last advance taken from this task's polls."""
        board = dg.read_board(self._board, self.world_size)
        seen = self._progress.setdefault(task, {})
        for r, slot in enumerate(board):
            mark = progress_mark(slot)
            if r not in seen or seen[r][0] != mark:
                seen[r] = (mark, now)
        self._progress = {task: seen}  # only the current task's
        return collective_hang(board, task, now, self.collective_bound, {r: t for r, (_, t) in seen.items()})

    # --- diagnosis -------------------------------------------------------
    def _dump_stacks(self, hosts, tids=None):
        """Ask live ``hosts`` for their Python stacks (faulthandler on SIGUSR1); wait
        until the dumps stop growing and hold every thread of ``tids`` (``{host: [thread
        ident]}``: a replica's thread may come last), at most 3 s."""
        paths = {i: self._stacks_path(i) for i in hosts}
        for i in hosts:
            try:
                os.kill(self.hosts[i][0].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        last, stable_since = None, None
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            time.sleep(DUMP_POLL_S)
            sizes = {i: (os.path.getsize(p) if os.path.exists(p) else 0) for i, p in paths.items()}
            if sizes == last and all(sizes.values()):
                if time.monotonic() - stable_since >= DUMP_STABLE_S and all(
                        set((tids or {}).get(i, ())) <= set(dg.thread_stacks(_read(p))) for i, p in paths.items()):
                    break
            else:
                last, stable_since = sizes, time.monotonic()

    def _fail(self, task, name, timeout, elapsed, pending, rows_by_host, raised, dead, hang):
        now = time.monotonic()
        alive = [i for i in range(len(self.hosts)) if i not in dead and self.hosts[i][0].is_alive()]
        board = dg.read_board(self._board, self.world_size)
        tids = {}
        for rank, b in enumerate(board):
            if b.get("tid"):
                tids.setdefault(self._host_of.get(rank, rank), []).append(b["tid"])
        self._dump_stacks(alive, tids)
        board = dg.read_board(self._board, self.world_size)
        diag = []
        for rank in range(self.world_size):
            host = self._host_of.get(rank, rank)
            pid = self.hosts[host][0].pid
            # before the kill: what the host holds now (all its replicas)
            rss = None if host in dead else (procmem.rss_mib(pid), procmem.peak_rss_mib(pid))
            diag.append(replica_diagnosis(
                rank, host, pid, task, board[rank], now=now, rss=rss,
                dump=_read(self._stacks_path(host)), host_tids=tids.get(host, []),
                log_tail=self.log_tail(host), raised=raised, dead=dead, pending=pending))
        err = replica_error(diag, f"{self.describe()}: task {name}", timeout=timeout, elapsed=elapsed,
                            raised=raised, dead=dead, hang=hang, collective_bound=self.collective_bound,
                            load=machine_load())
        # Only a raise (a dead host cannot rejoin). A peer inside a collective the culprit left
        # fails out of it when the reset cuts the culprit's connections; one elsewhere (a
        # collective the kit cannot see, e.g. in C++ under backward) gets RAISE_GRACE to reach
        # one or return, else the world is replaced.
        keep = type(err) is ReplicaFailed and not dead and not hang
        waiting = all(d["rank"] in raised or d["status"] == "ok" or d["in_collective"] for d in diag)
        if not (keep and self._reset(RESET_BOUND_S if waiting else RAISE_GRACE)):
            self._break()
        raise err

    def _reset(self, bound: float = RESET_BOUND_S) -> bool:
        """Make the world whole again after a replica raised, instead of replacing it: every
        host drops its process groups (a peer blocked in a collective the culprit left fails
        out of it and returns to its task loop) and rendezvous anew (the runtime's
        ``reset_host``; ~0.03 s, a new world forked from the host server ~0.1 s, docs/robustness.md).
        True when every host answered
        within ``bound`` seconds; late reports of the failed task are dropped."""
        if not self._resettable:
            return False
        self._generation += 1
        gen = self._generation
        try:
            for proc, conn in self.hosts:
                conn.send(("reset", gen))
            deadline = time.monotonic() + bound
            waiting = set(range(len(self.hosts)))
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait_any([self.hosts[i][1] for i in waiting] + [self.hosts[i][0].sentinel for i in waiting],
                         timeout=min(POLL_S, left))
                for i in sorted(waiting):
                    proc, conn = self.hosts[i]
                    while i in waiting and conn.poll():
                        msg = conn.recv()
                        if msg[0] == "reset" and msg[1] == gen:
                            if msg[2] is not None:
                                return False
                            waiting.discard(i)
                    if i in waiting and not proc.is_alive():
                        return False
        except (EOFError, OSError):
            return False
        self.resets += 1
        return True

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

    def request_stop(self) -> None:
        """Ask every started host to stop, without waiting (:meth:`close` waits): closing
        several worlds, each host's teardown then runs beside the others'."""
        if getattr(self, "_ranks", None) is None or self._stop_sent:  # a starting host reads no stop
            return
        self._stop_sent = True
        for proc, conn in self.hosts:
            if proc.is_alive():
                try:
                    conn.send(None)
                except (BrokenPipeError, OSError):
                    pass

    def close(self, graceful: bool = True) -> None:
        """Stop every host (politely when ``graceful``, then by SIGKILL); idempotent, and safe
        from two threads at once (an interrupted run's main thread closes the world a lane
        thread is closing after its hosts died: the second waits, then finds it closed)."""
        with self._close_lock:
            self._close(graceful)

    def _close(self, graceful: bool) -> None:
        graceful = graceful and getattr(self, "_ranks", None) is not None  # a starting host reads no stop
        if graceful:
            self.request_stop()
        deadline = time.monotonic() + (5.0 if graceful else 0.0)
        for proc, conn in self.hosts:
            if proc.pid is None:  # never started (Ctrl-C before its start())
                conn.close()
                continue
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


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


class PoolHalted(BaseException):
    """A world was asked of a halted :class:`WorldPool` (the run was interrupted). Not an
    ``Exception``, like ``KeyboardInterrupt``: a Hypothesis search or an evaluator's
    ``except Exception`` lets it through, so the thread asking stops at once."""


def _not_started(key) -> PoolHalted:
    runtime, world_size = key
    return PoolHalted(f"{runtime} world of {world_size} replica(s) not started: the run was interrupted")


#: Starts of one world :meth:`WorldPool.get` makes when a host crashes (a fatal signal) while
#: starting, before any task: a PJRT CPU host died of SIGSEGV while starting once in a CI run of
#: the PJRT tests (not seen in 170 starts since, 150 of them beside 4 busy loops). A crash at
#: every attempt is a runtime that cannot start, and is reported as such.
START_ATTEMPTS = 2


class WorldPool:
    """Worlds keyed by ``(runtime, world_size)``, started on first use, replaced when broken."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings()
        self._worlds: dict[tuple[str, int], World] = {}
        self._halted = False
        self._lock = threading.Lock()
        #: One line per world start that a host's crash undid and :meth:`get` made again
        #: (:data:`START_ATTEMPTS`); a run reports each as a warning.
        self.restarts: list[str] = []

    def get(self, runtime: str, world_size: int) -> World:
        """The started world of ``world_size`` replicas of ``runtime``. A start-up that a host's
        crash (a fatal signal before any task) undid is made again, up to :data:`START_ATTEMPTS`
        starts in all, and said in :attr:`restarts`.

        Raises:
            ReplicaError / RuntimeUnavailable: as :class:`World` (a crash at every start attempt:
                the last one's :class:`HostDiedStarting`).
            PoolHalted: the pool was halted (:meth:`halt`).
        """
        key = (runtime, world_size)
        with self._lock:  # another thread may halt the pool meanwhile
            if self._halted:
                raise _not_started(key)
            world = self._worlds.get(key)
        attempt = 1
        while True:
            if world is None or world.broken:
                # started outside the lock: a start can wait seconds on the fork server's imports
                world = self._keep(key, World(runtime, world_size, settings=self.settings, wait=False))
            try:
                world.wait_started()
                return world
            except HostDiedStarting as err:
                with self._lock:
                    if self._halted:  # the hosts were killed by the halt, not by a crash
                        raise _not_started(key) from None
                if not err.by_signal or attempt == START_ATTEMPTS:
                    raise
                self.restarts.append(f"{world.describe()}: {err.death} while starting"
                                     f"{f' at {err.where}' if err.where else ''} "
                                     f"(start {attempt} of {START_ATTEMPTS}); started again")
                attempt += 1

    def _keep(self, key, world: World) -> World:
        """``world``, now the pool's for ``key``; closed at once if the pool was halted while it started.

        Raises:
            PoolHalted: it was.
        """
        with self._lock:
            if not self._halted:
                self._worlds[key] = world
                return world
        world.close()
        raise _not_started(key)

    def prestart(self, runtime: str, world_size: int) -> World | None:
        """Spawn that world's hosts now, without waiting for them, so that they import the
        runtime while this process still works with another world (the PJRT default run used
        1.2 of 2 cores); :meth:`get` then returns it. Returns the world, or ``None`` when it
        cannot be started: the error is left for :meth:`get` to raise where it is reported."""
        key = (runtime, world_size)
        with self._lock:
            if self._halted:
                return None
            if key in self._worlds and not self._worlds[key].broken:
                return self._worlds[key]
        try:
            world = World(runtime, world_size, settings=self.settings, wait=False)
        except Exception:  # unavailable runtime, bad size, spawn failure: get() reports it
            return None
        try:
            return self._keep(key, world)
        except PoolHalted:
            return None

    def halt(self) -> None:
        """Close every world and start no new one (an interrupted run: a thread of it that
        asks for a world after this gets :class:`PoolHalted`, not a world nobody closes)."""
        with self._lock:
            self._halted = True
        self.close()

    def close(self) -> None:
        with self._lock:
            worlds = list(self._worlds.values())
            self._worlds.clear()
        for world in worlds:  # every host tears down at once, then each is reaped
            world.request_stop()
        for world in worlds:
            world.close()  # removes its work directory too
