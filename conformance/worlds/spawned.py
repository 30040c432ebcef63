"""A persistent world of replicas: host processes that run tasks on request.

A :class:`World` starts its host processes once (one per replica on the CPU runtime; one per
host with a thread per replica on PJRT), then runs many tasks on them; the pool that keeps
worlds by key and replaces broken ones is :class:`conformance.worlds.pool.WorldPool`. Every
wait is bounded and every failure is diagnosed per replica (docs/robustness.md; the errors:
:mod:`conformance.worlds.failure`; who is to blame: :func:`conformance.worlds.blame.blame`):

* a replica that raises reports it at once; the parent waits :data:`RAISE_GRACE` seconds for
  simultaneous failures, then raises ``ReplicaFailed``. Where the runtime can (CPU) the world is
  kept: the hosts drop their process groups, which ends the peers' collectives, and rendezvous
  anew (:meth:`World._reset`);
* a host process that exits is ``ReplicaDied``, with its exit code or signal and, after a fatal
  signal, its Python stacks (``faulthandler`` is enabled in every host);
* ``ReplicaTimeout`` only when a bound passed: the task's ``timeout``, or the runtime's
  collective bound (:attr:`conformance.worlds.runtimes.base.Runtime.collective_bound`) on a
  replica waiting in a collective while a peer is elsewhere. Both are below the runtime's own
  collective timeout, so the report names the peer, not the waiter.

Each replica's progress lives in a shared file the parent reads after a failure
(:mod:`conformance.worlds.diagnosis`). After any failure but a kept raise the world is broken.
The hosts (:mod:`conformance.worlds.host`) ignore SIGINT (an interrupted :meth:`World.run` kills
them), die with their parent and drop its launcher variables. Rendezvous uses a file in a
private temporary directory, never a port, so many worlds (pytest-xdist workers) coexist on one
machine. This module imports torch only inside host processes.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from multiprocessing.connection import wait as wait_any

from conformance.settings import Settings
from conformance.worlds import diagnosis as dg, procmem
from conformance.worlds.failure import (HostDiedStarting, ReplicaError, ReplicaFailed, ReplicaTimeout, all_waiting,
                                        collective_hang, machine_load, progress_mark, replica_diagnosis,
                                        replica_error)
from conformance.worlds.hoststart import host_context
from conformance.worlds.host import POLL_S, WATCH_S, host_main
from conformance.worlds.registry import RUNTIMES, WorldKey
from conformance.worlds.runtimes import check_world
from conformance.worlds.stacks import crash_site

# After the first replica raised (or a host died), how long the parent waits for other replicas'
# simultaneous reports; short: the others are most likely blocked in a collective the failed one left.
RAISE_GRACE = 2.0
# The grace ends early once every replica that has not reported is seen inside a collective (it
# cannot raise on its own before the runtime's timeout) at least this long after the first
# report: one stack sample of its host (every WATCH_S) taken since.
WAITING_SEEN_S = WATCH_S + 0.1
# Bound on making a world whole again after a raise (World._reset: a tenth of a second is usual);
# past it, or on any error, the world is torn down and replaced.
RESET_BOUND_S = 15.0
LOG_TAIL_LINES = 200
# Of a host's faulthandler dump in a start-up failure: a fatal signal's dump of every thread.
STACKS_TAIL_LINES = 120


class World:
    """The world ``world`` names, started now and kept until :meth:`close`.

    Args:
        world: its :class:`~conformance.worlds.registry.WorldKey`, or a spelled name with
            ``world_size`` (``"cpu", 2``; ``"pjrt_spmd:2", 1``: :meth:`WorldKey.of
            <conformance.worlds.registry.WorldKey.of>`).
        world_size: replicas of a spelled ``world`` (``>= 1``); not needed with a key.
        timeout: default bound in seconds on each task (default ``settings.replica_timeout``).
        settings: the run's :class:`~conformance.settings.Settings` (default: built-in defaults).
        wait: wait here for every host's start-up answer; ``False`` returns once the host processes
            are spawned (they import the runtime meanwhile) and the first :meth:`run` (or
            :meth:`wait_started`) waits, bounded by ``settings.start_timeout`` from then.

    Attributes:
        key: the world's key; ``runtime`` its name (for display); ``world_size`` its replicas.
        subject: the implementation whose cases the world runs now (``None`` before the first);
            set by :meth:`conformance.evaluate.Session.run`, which puts the world's snapshot back
            when it changes (:mod:`conformance.worlds.isolation`).

    Raises:
        ReplicaError: the hosts cannot start within ``settings.start_timeout`` (with ``wait=False``:
            raised by :meth:`wait_started` / :meth:`run`).
        conformance.worlds.runtimes.RuntimeUnavailable: the runtime cannot run here.
        KeyError: an unknown runtime or topology.
    """

    def __init__(self, world: WorldKey | str, world_size: int | None = None, timeout: float | None = None,
                 settings: Settings | None = None, wait: bool = True):
        settings = settings or Settings()
        if timeout:  # the hosts size gloo's timeout from the task bound (runtimes.cpu)
            settings = settings.replace(replica_timeout=timeout)
        key = WorldKey.of(world, world_size)
        self.settings = settings
        self.key, self.runtime, self.world_size = key, key.world, key.replicas
        self.timeout = settings.replica_timeout
        self.broken = False
        self.subject = None
        self.hosts = []
        self._close_lock = threading.Lock()  # close() from two threads (lanes)
        adapter = check_world(key, settings)
        self.collective_bound = adapter.collective_bound
        self._progress = {}  # {task: {rank: (progress mark, time it last changed)}}
        self._ranks, self._host_of = None, {}
        self._next_task, self._stop_sent = 0, False
        self._generation = 0  # of the hosts' rendezvous (World._reset)
        self.resets, self._resettable = 0, adapter.resettable  # resets: failures this world survived
        self.workdir = tempfile.mkdtemp(prefix=f"ddpconf-{self.runtime}{self.world_size}-")
        self._board = os.path.join(self.workdir, "progress")
        dg.create_board(self._board, self.world_size)
        self._spawn_hosts(adapter)
        if wait:
            self.wait_started()

    def _spawn_hosts(self, adapter) -> None:
        """Start one host process per environment of ``adapter.host_envs``, without waiting."""
        ctx = host_context(self.settings.host_start)
        # The host resolves the runtime in its own registry: one registered in this process
        # after the fork server started (a test's, a plugin's) travels with the host's arguments.
        registered = (self.key.runtime, RUNTIMES[self.key.runtime])
        try:
            for host, env in enumerate(adapter.host_envs(self.world_size)):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=host_main, daemon=True, name=f"{self.runtime}-host{host}",
                                   args=(self.key, host, child, self.workdir, env, os.getpid(), self.settings,
                                         dict(os.environ), registered))
                # Listed before start(): a Ctrl-C inside start() must not leave a started host
                # unkilled (multiprocessing's exit handler would SIGTERM and join it unbounded).
                self.hosts.append((proc, parent))
                proc.start()
                child.close()
        except BaseException:  # a host still starting reads no stop message: kill at once
            self.close(graceful=False)
            raise

    def wait_started(self) -> None:
        """Wait (once) for every host's start-up answer, bounded by ``settings.start_timeout``.

        Raises:
            ReplicaError: a host failed, died or did not answer in time; the world is then broken.
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
        """Run ``fn(ctx, **payload)`` on every replica; return results by global ordinal. ``fn``
        must be a module-level function (it is pickled by reference); ``payload`` and results must
        be picklable (numpy, not tensors).

        Raises:
            ReplicaFailed / ReplicaTimeout / ReplicaDied: see the classes; the world is then broken,
                except after a raise it could reset (:meth:`_reset`; :attr:`resets` counts them).
                ``KeyboardInterrupt`` kills the hosts first, then propagates.
        """
        self.wait_started()
        if self.broken:
            raise ReplicaError(f"{self.describe()} is broken by an earlier failure")
        self._next_task += 1
        task = self._next_task
        try:
            self._send_all((task, fn, payload))
            return self._collect_task(task, dg.task_name(fn, payload), timeout or self.timeout)
        except ReplicaError:
            raise
        except BaseException:  # Ctrl-C or a bug here: never leave hosts running a task
            self._break()
            raise

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
            ready = wait_any([x for i in pending for x in (self.hosts[i][1], self.hosts[i][0].sentinel)], timeout=left)
            for i in pending:
                proc, conn = self.hosts[i]
                try:
                    msg = conn.recv() if conn in ready or conn.poll() else None
                except (EOFError, OSError):
                    msg = None
                if msg is None:
                    if proc.sentinel in ready or not proc.is_alive():
                        proc.join(1)
                        code, sig = dg.exit_description(proc.exitcode)
                        death = f"host {i} (pid {proc.pid}) exited with code {code}{f' ({sig})' if sig else ''}"
                        message = f"{self.describe()}: {death} while starting\n" + self._logs([i], stacks=True)
                        where = crash_site(dg.read_text(self._stacks_path(i)))
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
        """Each host's log tail; with ``stacks``, also its ``faulthandler`` dump (a fatal signal's,
        or the one :meth:`_dump_stacks` asked for): all there is of a crash in C++ code."""
        out = []
        for i in hosts:
            out.append(f"\n--- host {i} log tail:\n{self.log_tail(i)}")
            dump = dg.tail(self._stacks_path(i), STACKS_TAIL_LINES) if stacks else ""
            if dump.strip():
                out.append(f"\n--- host {i} stacks (faulthandler):\n{dump}")
        return "".join(out)

    def _collect_task(self, task, name, timeout):
        """Wait for task ``task`` on every host; classify and raise on any failure."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        seen = _TaskWait(set(range(len(self.hosts))))
        while seen.pending:
            now = time.monotonic()
            if self._wait_ends(task, seen, now, deadline):
                break
            end = deadline if seen.failed_at is None else min(deadline, seen.failed_at + RAISE_GRACE)
            # after a report, wake at each stack sample: the grace may end at the next one
            poll = POLL_S if seen.failed_at is None else WATCH_S
            ready = wait_any([x for i in seen.pending for x in (self.hosts[i][1], self.hosts[i][0].sentinel)],
                             timeout=max(0.0, min(poll, end - now)))
            for i in sorted(seen.pending):
                self._receive(i, task, seen, ready)
        elapsed = time.monotonic() - t0
        if not seen.raised and not seen.dead and not seen.pending:
            results = [None] * self.world_size
            for rows in seen.rows_by_host.values():
                for rank, _, value in rows:
                    results[rank] = value
            return results
        self._fail(task, name, timeout, elapsed, seen)

    def _wait_ends(self, task, seen: "_TaskWait", now: float, deadline: float) -> bool:
        """The wait for ``task`` ends at ``now``: the grace after the first report passed (or
        every peer is known to be waiting), the task bound passed, or a replica waited in a
        collective past the collective bound (then in ``seen.hang``)."""
        if seen.failed_at is not None:
            if now >= seen.failed_at + RAISE_GRACE:
                return True
            if (not seen.dead and now >= seen.failed_at + WAITING_SEEN_S
                    and (self._resettable or self._all_waiting(task, seen.pending))):
                return True  # a reset ends a peer's wait in the culprit's collective (World._reset)
        if now >= deadline:
            return True
        if self.collective_bound is not None and seen.failed_at is None:
            seen.hang = self._collective_hang(task, now)
            return bool(seen.hang)
        return False

    def _receive(self, i: int, task, seen: "_TaskWait", ready) -> None:
        """Read what host ``i`` sent about ``task`` into ``seen`` (``ready``: the connections
        ``wait`` found readable): its replicas' raises, then its results; a host that exited
        without a word is dead."""
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
                seen.raised.setdefault(msg[2], msg[3])
                seen.failed()
            elif msg[0] == "done" and msg[1] == task:
                seen.rows_by_host[i] = msg[2]
                for rank, ok, value in msg[2]:
                    if not ok:
                        seen.raised.setdefault(rank, value if isinstance(value, dict) else
                                               {"exception_type": None, "traceback": str(value)})
                        seen.failed()
                seen.pending.discard(i)
                break
        if i in seen.pending and not got_any and not proc.is_alive():
            proc.join(1)
            seen.dead[i] = proc.exitcode
            seen.pending.discard(i)
            seen.failed()

    def _all_waiting(self, task, pending):
        """Every replica of the ``pending`` hosts is inside a collective of ``task``."""
        ranks = [r for r in range(self.world_size) if self._host_of.get(r, r) in pending]
        return all_waiting(dg.read_board(self._board, self.world_size), ranks, task)

    def _collective_hang(self, task, now):
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
        """Ask live ``hosts`` for their Python stacks and wait for the dumps
        (:func:`conformance.worlds.diagnosis.request_stacks`)."""
        dg.request_stacks({i: self.hosts[i][0].pid for i in hosts}, {i: self._stacks_path(i) for i in hosts}, tids)

    def _fail(self, task, name, timeout, elapsed, seen: "_TaskWait"):
        """Diagnose every replica and raise the task's error; the world is kept only if a reset can."""
        now = time.monotonic()
        raised, dead, hang = seen.raised, seen.dead, seen.hang
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
                dump=dg.read_text(self._stacks_path(host)), host_tids=tids.get(host, []),
                log_tail=self.log_tail(host), raised=raised, dead=dead, pending=seen.pending))
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
        """Make the world whole again after a replica raised, instead of replacing it: every host
        drops its process groups (a peer blocked in a collective the culprit left fails out of it)
        and rendezvous anew (the runtime's ``reset_host``: docs/robustness.md "A raise keeps the
        world"). True when every host answered within ``bound`` seconds; late reports of the
        failed task are dropped."""
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
                wait_any([x for i in waiting for x in (self.hosts[i][1], self.hosts[i][0].sentinel)],
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
        return dg.tail(os.path.join(self.workdir, f"host{host}.log"), LOG_TAIL_LINES)

    def pids(self) -> list[int]:
        return [p.pid for p, _ in self.hosts]

    def _break(self):
        self.broken = True
        self.close(graceful=False)

    def retire(self) -> None:
        """Close the world for good and mark it broken, so that its pool starts a fresh one: a
        change in its processes cannot be put back (:mod:`conformance.worlds.isolation`)."""
        self._break()

    def request_stop(self) -> None:
        """Ask every started host to stop, without waiting (:meth:`close` waits): closing
        several worlds, each host's teardown then runs beside the others'."""
        if self._ranks is None or self._stop_sent:  # a starting host reads no stop
            return
        self._stop_sent = True
        self._send_all(None)

    def _send_all(self, msg) -> None:
        for proc, conn in self.hosts:
            try:
                conn.send(msg)
            except OSError:  # a dead host: reported where it is waited for
                pass

    def close(self, graceful: bool = True) -> None:
        """Stop every host (politely when ``graceful``, then by SIGKILL); idempotent, and safe
        from two threads at once (an interrupted run's main thread closes the world a lane
        thread is closing after its hosts died: the second waits, then finds it closed)."""
        with self._close_lock:
            graceful = graceful and self._ranks is not None  # a starting host reads no stop
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


@dataclasses.dataclass
class _TaskWait:
    """What :meth:`World._collect_task` has seen of one task: the hosts still running it, each
    finished host's rows, who raised (``{rank: info}``), the hosts that died (``{host: exit code}``),
    when the first failure was reported, and a collective hang."""

    pending: set
    rows_by_host: dict = dataclasses.field(default_factory=dict)
    raised: dict = dataclasses.field(default_factory=dict)
    dead: dict = dataclasses.field(default_factory=dict)
    failed_at: float | None = None
    hang: tuple | None = None

    def failed(self) -> None:
        self.failed_at = self.failed_at or time.monotonic()
