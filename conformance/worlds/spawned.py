"""A persistent world of replicas: host processes that run tasks on request.

A :class:`World` starts its host processes once (one per replica on the CPU
runtime; one per host with a thread per replica on PJRT), then runs many tasks
on them. Every wait is bounded, and every failure is classified and diagnosed
per replica (:attr:`ReplicaError.diagnosis`):

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
``waiting``; the one elsewhere, behind, returned or dead is the culprit.

Each replica's progress (task, step, phase, last collective; tasks add to it
with :meth:`ReplicaContext.note <conformance.worlds.runtimes.base.ReplicaContext.note>`)
lives in a shared file the parent reads after a failure
(:mod:`conformance.worlds.diagnosis`). After any other failure (or a reset that did not
complete) the world is broken and must be replaced (:class:`WorldPool` does that).

Hosts ignore SIGINT (the parent owns Ctrl-C: an interrupted :meth:`World.run`
kills the hosts) and die with their parent (``PR_SET_PDEATHSIG`` plus a
watchdog thread), so no orphans remain. Hosts drop the parent's launcher
variables (:data:`SCRUBBED_LAUNCHER_VARS`): a kit-spawned world is never part of a
torchrun launch it happens to be started from. Rendezvous uses a file in a
private temporary directory, never a port, so many worlds (pytest-xdist
workers) coexist on one machine.

This module imports torch only inside host processes.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_any

from conformance.settings import Settings
from conformance.worlds import blame as blame_mod, diagnosis as dg, procmem
import faulthandler
import gc
import sys
from conformance.worlds.runtimes import get_runtime, pjrt_graphs

# After the first replica raised (or a host died), how long the parent waits
# for other replicas' simultaneous reports before it tears the world down.
# Short: the others are most likely blocked in a collective the failed one left.
RAISE_GRACE = 2.0
# How often the parent reads the progress board while waiting (collective bound).
POLL_S = 0.5
# The grace ends early once every replica that has not reported is seen inside a collective
# (it cannot raise on its own before the runtime's timeout) at least this long after the
# first report: one stack sample of its host (every POLL_S) taken since.
WAITING_SEEN_S = POLL_S + 0.2
# Bound on making a world whole again after a raise (World._reset); past it, or on any
# error, the world is torn down and replaced as before. Measured ~0.1 s.
RESET_BOUND_S = 15.0
LOG_TAIL_LINES = 200
# Variables of an env:// launcher (torchrun) that a kit-spawned host must not
# inherit from its parent: they would override the host's own rank layout
# (e.g. GROUP_RANK=1 labels every replica "host 1").
SCRUBBED_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                 "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


class ReplicaError(RuntimeError):
    """A task did not complete on every replica.

    ``str(exc)`` is :meth:`summary` followed by :meth:`details`.

    Attributes:
        diagnosis: one ``dict`` per replica, by rank, with the keys of
            :data:`conformance.worlds.diagnosis.DIAGNOSIS_KEYS` (``None`` when
            unknown): ``rank``, ``host``, ``pid``, ``status`` (``raised``,
            ``hung``, ``died``, ``waiting``, ``aborted-by-peer``, ``ok``; see
            :class:`conformance.worlds.blame.Blame`), ``task``, ``step``, ``phase``,
            ``last_collective``, ``collectives`` (kit-recorded, entered in the
            task), ``in_collective`` (recorded, or found in its stack or
            traceback), ``waited_s``, ``exception_type``,
            ``exception_message``, ``traceback``, ``stacks`` (faulthandler with
            source lines: this replica's thread, then on a one-replica host its
            other threads), ``exit_code``, ``signal``, ``log_tail`` (its host's
            last :data:`LOG_TAIL_LINES` lines), ``rss_mib`` / ``peak_rss_mib``
            (its host process at the report, MiB), plus ``culprit`` (bool:
            named in the summary) and ``culprit_reason``. Empty when the
            failure is not per-replica (e.g. a broken world reused).
    """

    def __init__(self, message: str, diagnosis: list[dict] | None = None):
        self._summary, _, rest = message.partition("\n")
        self._details = rest
        self.diagnosis = diagnosis or []
        text = self._summary + (f"\n{rest}" if rest else "")
        super().__init__(text)

    def summary(self) -> str:
        """One line: the world, the failure kind, the replica(s) to blame and the exception."""
        return self._summary

    def details(self) -> str:
        """Full text: per replica status, place, exception, traceback, stacks, log tail."""
        return self._details


class ReplicaFailed(ReplicaError):
    """A replica raised; the diagnosis holds its exception and traceback."""


def machine_load() -> str:
    """``machine load 7.9 (1 min average) on 2 CPUs``: said where a time bound fires, since a
    bound that assumes a quiet machine can fire on a loaded one (os.getloadavg; 'unknown' where
    the platform has none)."""
    try:
        one = os.getloadavg()[0]
    except (AttributeError, OSError):
        return "machine load unknown"
    return f"machine load {one:.1f} (1 min average) on {os.cpu_count()} CPUs"


class ReplicaTimeout(ReplicaError):
    """A bound passed: the task's timeout, or a replica waited in a collective a
    peer never entered for the runtime's collective bound (or raised the runtime's
    own collective timeout while a peer was elsewhere); stacks of every replica."""


class ReplicaDied(ReplicaError):
    """A host process exited; the diagnosis holds its exit code or signal, stacks, log tail."""


def _tail(path, lines=LOG_TAIL_LINES):
    return dg.tail(path, lines)


def _die_with_parent(parent_pid):
    try:  # Linux: the kernel kills us when the parent goes.
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(70)
    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def _instrument(ctx, board, host, runtime):
    """Give a replica its progress slot; record its collectives (and XLA step syncs)."""
    p = board.slot(ctx.rank, host=host, pid=os.getpid(),
                   tid=ctx.extra.get("thread_ident") or threading.get_ident())
    ctx.progress = p
    ctx.collectives = dg.RecordingCollectives(ctx.collectives, p)
    if runtime.step_sync_runs_collectives:
        ctx.mark_step = dg.recorded_step_sync(ctx.mark_step, p)


def _sample_stacks(skip: int) -> dict[int, str]:
    """``{thread ident: stack}`` of every thread of this process but ``skip``, innermost frame
    first, each stack in ``faulthandler``'s format (what :mod:`conformance.worlds.blame` reads).

    From ``sys._current_frames()``, which walks the interpreter's thread list under its
    lock. ``faulthandler.dump_traceback`` walks it without one (it is written for signal
    handlers): called every half second it raced threads that C++ code gives a thread state
    and takes it back, and killed the host with SIGSEGV (a reference DDP replica on CPU died
    in 2 of 3 runs of the parity and scenario cases when sampled every 2 ms; once in a full
    test run at every 500 ms). The frames are read into strings at once (microseconds, no I/O,
    no garbage collection) and dropped before anything else: a frame object still held when its
    function returns keeps the function's locals alive, and on PJRT a lazy tensor kept alive
    that way is one more output of the replica's next graph (docs/runtimes/pjrt.md, cause 1)."""
    collecting = gc.isenabled()
    gc.disable()  # a collection could run finalizers, which may release the GIL
    frames = frame = None
    try:
        frames = sys._current_frames()
        out = {}
        for tid, frame in frames.items():
            if tid == skip:
                continue
            lines = [f"Thread 0x{tid:016x} (most recent call first):"]
            while frame is not None:
                code = frame.f_code
                lines.append(f'  File "{code.co_filename}", line {frame.f_lineno or 0} in {code.co_name}')
                frame = frame.f_back
            out[tid] = "\n".join(lines)
        return out
    finally:
        frames = frame = None  # noqa: F841  (drop every frame reference before anything else)
        if collecting:
            gc.enable()


def _watch_collectives(replicas, every=POLL_S):
    """Host thread: every ``every`` seconds, record in each running replica's progress
    the collective its stack shows (:func:`conformance.worlds.blame.collective_in`), so the
    collective bound applies to a DDP that calls torch.distributed or torch_xla itself.
    On a host of one replica every thread counts (a DDP's communication thread). Stacks come
    from :func:`_sample_stacks` (safe to call often, holds no frame)."""
    me = threading.get_ident()
    while True:
        time.sleep(every)
        try:
            blocks = _sample_stacks(skip=me)
            for ctx in replicas:
                p = ctx.progress
                if p.state.get("state") != "running" or p.state.get("in_collective"):
                    p.seen_in(None)
                    continue
                tids = [p.state.get("tid")] if len(replicas) > 1 else list(blocks)
                stacks = [blocks[t] for t in tids if t in blocks]
                p.seen_in(next((c for c in map(blame_mod.collective_in, stacks) if c), None))
        except Exception:  # a sample is only a hint; never take the host down
            pass


def _host_main(runtime_name, host, world_size, conn, workdir, env, parent_pid, settings):
    """Entry point of a host process (spawned; runs until told to stop)."""
    for var in SCRUBBED_LAUNCHER_VARS:  # before anything reads them (torch.distributed, ranks)
        os.environ.pop(var, None)
    log_fd = os.open(os.path.join(workdir, f"host{host}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    stacks = open(os.path.join(workdir, f"host{host}.stacks"), "w")
    # Fatal signals (an abort by gloo or XLA, a segfault) dump every thread's
    # Python stack; SIGUSR1 is the parent asking for them.
    faulthandler.enable(file=stacks, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    os.environ.update(env)
    send_lock = threading.Lock()

    def send(msg):
        with send_lock:
            conn.send(msg)
    try:
        from conformance.worlds.runtimes import get_runtime
        runtime = get_runtime(runtime_name, settings)
        replicas = runtime.setup_host(host, world_size, workdir)
        board = dg.ProgressBoard(os.path.join(workdir, "progress"))
        for ctx in replicas:
            _instrument(ctx, board, host, runtime)
        threading.Thread(target=_watch_collectives, args=(replicas,), daemon=True,
                         name="collective-watch").start()
        send(("ready", [r.rank for r in replicas]))
    except BaseException:
        send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            break
        if msg[0] == "reset":  # ("reset", generation), see World._reset
            send(("reset", msg[1], _reset_host(runtime, replicas, msg[1], workdir, stacks)))
            continue
        task_id, fn, payload = msg

        def on_raise(rank, info, task_id=task_id):  # at once, from the replica's thread
            send(("raised", task_id, rank, info))
        results = runtime.execute(replicas, fn, payload, on_raise=on_raise, task=task_id)
        send(("done", task_id, results))
    runtime.teardown_host(replicas)


def _reset_host(runtime, replicas, generation, workdir, stacks):
    """Host side of :meth:`World._reset`: ``None``, or the traceback of why it failed."""
    try:
        runtime.reset_host(replicas, generation, workdir)
        # the next failure's report must not read this one's stacks
        os.ftruncate(stacks.fileno(), 0)
        os.lseek(stacks.fileno(), 0, os.SEEK_SET)
    except BaseException:
        return traceback.format_exc()
    return None


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
        adapter = get_runtime(runtime, settings)
        adapter.check(world_size)
        self.collective_bound = adapter.collective_bound
        self.workdir = tempfile.mkdtemp(prefix=f"ddpconf-{runtime}{world_size}-")
        self._board = os.path.join(self.workdir, "progress")
        dg.create_board(self._board, world_size)
        ctx = mp.get_context("spawn")
        try:
            for host, env in enumerate(adapter.host_envs(world_size)):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_host_main, daemon=True, name=f"{runtime}-host{host}",
                                   args=(runtime, host, world_size, child, self.workdir, env, os.getpid(), settings))
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
                self._break()
                raise ReplicaTimeout(f"{self.describe()}: host(s) {pending} did not start within "
                                     f"{timeout:.0f} s\n" + self._logs(pending))
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
                        self._break()
                        code, sig = dg.exit_description(proc.exitcode)
                        raise ReplicaDied(f"{self.describe()}: host {i} (pid {proc.pid}) exited with code "
                                          f"{code}{f' ({sig})' if sig else ''} while starting\n" + self._logs([i]))
                    continue
                if msg[0] == "error":
                    self._break()
                    raise ReplicaFailed(f"{self.describe()}: host {i} failed to start\n{msg[1]}"
                                        + self._logs([i]))
                got[i] = msg[1]
        return [got[i] for i in range(len(self.hosts))]

    def _logs(self, hosts):
        return "".join(f"\n--- host {i} log tail:\n{self.log_tail(i)}" for i in hosts)

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
                    and self._all_waiting(task, pending)):
                break
            if now >= deadline:
                break
            if self.collective_bound is not None and failed_at is None:
                hang = self._collective_hang(task, pending, rows_by_host, now)
                if hang:
                    break
            limit = min(deadline, failed_at + RAISE_GRACE if failed_at is not None else deadline) - now
            ready = wait_any([self.hosts[i][1] for i in pending] + [self.hosts[i][0].sentinel for i in pending],
                             timeout=max(0.0, min(POLL_S, limit)))
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
        """Every replica of the ``pending`` hosts is inside a collective of ``task``
        (kit-recorded, or seen in its stack)."""
        board = [_inside(b) for b in dg.read_board(self._board, self.world_size)]
        ranks = [r for r in range(self.world_size) if self._host_of.get(r, r) in pending]
        return all(board[r].get("task") == task and board[r].get("in_collective") for r in ranks)

    def _collective_hang(self, task, pending, rows_by_host, now):
        """A replica waited in a collective longer than the collective bound while a
        peer is elsewhere: ``(board, waiting ranks)``, else ``None``."""
        board = [_inside(b) for b in dg.read_board(self._board, self.world_size)]
        current = [b for b in board if b.get("task") == task]
        waiting = [b["rank"] for b in current
                   if b.get("in_collective") and b.get("since") and now - b["since"] > self.collective_bound]
        if not waiting:
            return None
        elsewhere = [r for r in range(self.world_size)
                     if not board[r].get("in_collective") or board[r].get("task") != task]
        # All inside collectives, but not the same one: they will never meet.
        mismatch = len({(b.get("collectives"), (b.get("in_collective") or "").split(" ")[0])
                        for b in current if b.get("in_collective")}) > 1
        return (board, waiting) if elsewhere or mismatch else None

    # --- diagnosis -------------------------------------------------------
    def _dump_stacks(self, hosts, tids=None):
        """Ask live ``hosts`` for their Python stacks (faulthandler on SIGUSR1); wait
        until the dumps stop growing and hold every thread of ``tids`` (``{host: [thread
        ident]}``: a replica's thread may come last), at most 3 s."""
        paths = {i: os.path.join(self.workdir, f"host{i}.stacks") for i in hosts}
        for i in hosts:
            try:
                os.kill(self.hosts[i][0].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        last, stable_since = None, None
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            time.sleep(0.1)
            sizes = {i: (os.path.getsize(p) if os.path.exists(p) else 0) for i, p in paths.items()}
            if sizes == last and all(sizes.values()):
                if time.monotonic() - stable_since >= 0.2 and all(
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
            proc = self.hosts[host][0]
            b = board[rank] if board[rank].get("task") == task else {}
            d = dg.blank(rank) | {"host": host, "pid": proc.pid, "task": task, "culprit": False}
            for k in ("step", "phase", "last_collective", "collectives", "in_collective"):
                d[k] = b.get(k)
            if b.get("own_graphs"):  # PJRT: a step sync of the DDP's own (runtimes.pjrt_graphs)
                d["own_graphs"] = b["own_graphs"]
            since = b.get("since") if b.get("in_collective") else b.get("seen_since")
            if since:
                d["waited_s"] = round(now - since, 1)
            if host not in dead:  # before the kill: what the host holds now (all its replicas)
                d["rss_mib"], d["peak_rss_mib"] = procmem.rss_mib(proc.pid), procmem.peak_rss_mib(proc.pid)
            dump = _read(os.path.join(self.workdir, f"host{host}.stacks"))
            seen_in = None
            if dump:  # one replica per host: its other threads (a DDP's comm thread) count too
                d["stacks"], seen_in = _replica_stacks(dump, b.get("tid") or board[rank].get("tid"),
                                                       tids.get(host, []))
            d["log_tail"] = self.log_tail(host)
            if rank in raised:
                info = raised[rank]
                for k in ("exception_type", "exception_message", "traceback"):
                    d[k] = info.get(k)
                for k in ("step", "phase", "last_collective", "in_collective"):
                    if info.get(k) is not None or k == "in_collective":
                        d[k] = info.get(k)
                # an exception out of torch.distributed itself (gloo's timeout) was a wait
                d["in_collective"] = d["in_collective"] or blame_mod.collective_in(d["traceback"] or "")
                d["waited_s"] = None
                d["status"] = "raised"
            elif host in dead:
                d["exit_code"], d["signal"] = dg.exit_description(dead[host])
                d["status"] = "died"
            elif host in pending:  # its host still runs the task: this replica may have returned
                d["status"] = "ok" if b.get("state") == "returned" else "hung"
            else:
                d["status"] = "ok"
            if d["status"] in ("hung", "died") and not d["in_collective"]:
                # a collective the kit did not record: in the stacks now, else the last sample
                d["in_collective"] = seen_in if dump else b.get("seen_collective")
            if not d["in_collective"]:
                d["waited_s"] = None
            diag.append(d)
        summary, cls = self._classify(diag, name, timeout, elapsed, raised, dead, hang)
        err = cls(f"{summary}\n{dg.details(diag)}", diag)
        # Only a raise with every other replica returned or inside a collective (which the
        # reset ends): one computing elsewhere may never return, a dead host cannot rejoin.
        keep = (cls is ReplicaFailed and not dead and not hang
                and all(d["rank"] in raised or d["status"] == "ok" or d["in_collective"] for d in diag))
        if not (keep and self._reset()):
            self._break()
        raise err

    def _reset(self) -> bool:
        """Make the world whole again after a replica raised, instead of replacing it: every
        host drops its process groups (a peer blocked in a collective the culprit left fails
        out of it and returns to its task loop) and rendezvous anew (the runtime's
        ``reset_host``). A new world costs an interpreter, a torch import and a rendezvous per
        host: 5-15 s under load, ~1 s here (docs/robustness.md). True when every host answered
        within :data:`RESET_BOUND_S`; late reports of the failed task are dropped."""
        if not self._resettable:
            return False
        self._generation += 1
        gen = self._generation
        try:
            for proc, conn in self.hosts:
                conn.send(("reset", gen))
            deadline = time.monotonic() + RESET_BOUND_S
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

    def _classify(self, diag, name, timeout, elapsed, raised, dead, hang):
        """Decide the error class and the replicas to blame (:func:`conformance.worlds.blame.blame`);
        set statuses and culprits; return the summary."""
        head = f"{self.describe()}: task {name}"
        verdict = blame_mod.blame(diag)
        for d in diag:
            d["status"] = verdict.status[d["rank"]]
            d["culprit"] = d["rank"] in verdict.culprits
            d["culprit_reason"] = verdict.reason.get(d["rank"]) if d["culprit"] else None
        culprits = [d for d in diag if d["culprit"]]
        mism = [d for d in diag if d["status"] == "mismatched"]
        if mism:  # the runtime aborted a receiver: the calls did not match (blame.MISMATCH)
            words = next(filter(None, (blame_mod.mismatch_text(d) for d in mism)), "")
            sides = "; ".join(f"replica {d['rank']}: {dg.where(d) or 'no progress noted'}" for d in mism)
            return (f"{head}: collective mismatch between replicas {', '.join(str(d['rank']) for d in mism)} "
                    f"(the runtime says: {words[:300]}): their calls at this point differ in kind or size; "
                    f"which replica deviated cannot be told from their stacks [{sides}]"), \
                (ReplicaDied if dead else ReplicaFailed)
        if dead:
            died = [d for d in diag if d["status"] == "died"]
            hosts = sorted({d["host"] for d in died})
            parts = []
            for h in hosts:
                ds = [d for d in died if d["host"] == h]
                d0 = ds[0]
                how = (f"killed by {d0['signal']}" if d0["signal"] else f"exited with code {d0['exit_code']}")
                ranks = ", ".join(str(d["rank"]) for d in ds)
                last = [ln.strip() for ln in (d0.get("log_tail") or "").splitlines() if ln.strip()]
                if d0["signal"] == "SIGABRT" and last:  # the runtime's own words (gloo, XLA)
                    how += f" ({last[-1][:300]})"
                parts.append(f"replica {ranks} (host {h}, pid {d0['pid']}) died: {how}")
            # What each replica was doing: who waited in a collective, who was elsewhere.
            doing = [f"replica {d['rank']}: {dg.where(d) or 'no progress noted'}" for d in diag
                     if dg.where(d)]
            # An abort inside a collective whose peers sit in a different one (gloo's
            # "Received data size doesn't match"): name both sides of the mismatch.
            other = [d for d in culprits if d["status"] != "died"]
            if other:
                aborted = [d for d in died if d["signal"] == "SIGABRT" and d.get("in_collective")]
                parts.append("collective mismatch: " + " vs ".join(
                    f"replica {x['rank']} in {x['last_collective'] or x['in_collective']} (step {x.get('step')})"
                    for x in aborted[:1] + other))
            suspects = [d for d in culprits if d["status"] == "died" and d["culprit_reason"] != "died"]
            if suspects:
                parts.append("; ".join(f"replica {d['rank']} is the suspect: outside any collective "
                                        f"({dg.where(d) or 'no progress noted'}) while its peers waited in one"
                                        for d in suspects))
            graphs = pjrt_graphs.describe(diag)
            if graphs:  # the cause a user must fix, before where they died
                parts.insert(0, graphs)
            # the culprit's words lead: the suspect or the mismatch when named, else the dead
            return (_lead(parts[:1] if graphs else parts[-1:] if other or suspects else parts)
                    + f"{head}: {len(died)} replica(s) died: " + "; ".join(parts)
                    + (f" [{'; '.join(doing)}]" if doing else "")), ReplicaDied
        if any(d["status"] == "raised" for d in culprits):
            parts = []
            for d in culprits:
                place = "; ".join(x for x in (f"host {d['host']}, pid {d['pid']}", dg.where(d)) if x)
                parts.append(f"replica {d['rank']} raised {d['exception_type']}: "
                             f"{_first_line(d['exception_message'])} [{place}]")
            return _lead(parts, culprits) + f"{head}: {len(culprits)} replica(s) raised; " + "; ".join(parts), ReplicaFailed
        # A hang: the task bound passed, a replica waited past the collective bound, or
        # the runtime's own collective timeout fired first (the waiters raised it).
        if raised:
            why = (f"replica(s) {sorted(raised)} raised inside a collective (the runtime's own timeout) "
                   f"after {elapsed:.1f} s of the task")
        elif hang:
            why = (f"replica(s) {hang[1]} waited in a collective for more than the collective bound "
                   f"({self.collective_bound:.0f} s, below the runtime's own collective timeout) "
                   f"after {elapsed:.1f} s of the task")
        else:
            why = f"no answer within {timeout:.0f} s (task bound; {elapsed:.1f} s elapsed)"
        if any((d["culprit_reason"] or "").startswith("in a different collective") for d in culprits):
            why += "; the replicas wait in different collectives (a replica skipped or added one)"
        why += f"; {machine_load()}"  # a bound that fired on a busy machine says so
        parts = []
        for d in culprits:
            if d["status"] == "ok":
                after = f" after {d['collectives']} recorded collective(s)" if d.get("collectives") else ""
                parts.append(f"replica {d['rank']} returned from the task{after} while others wait in a "
                             f"collective ({dg.where(d) or 'no progress noted'})")
            else:
                d["status"] = "hung"
                outside = "outside any collective" in (d["culprit_reason"] or "")
                top = _top_frame(d.get("stacks") or "")
                parts.append(f"replica {d['rank']} hung{' outside any collective' if outside else ''}"
                             f"{f' at {top}' if top else ''} ({dg.where(d) or 'no progress noted'}; "
                             f"rss {_mib(d.get('rss_mib'))})")
        waits = [f"replica {d['rank']} in {d['last_collective'] or d['in_collective']}"
                 + (f" for {d['waited_s']:.1f} s" if d.get("waited_s") is not None else "")
                 + (f" (raised {d['exception_type']})" if d.get("exception_type") else "")
                 for d in diag if d["status"] == "waiting"]
        return (_lead(parts, culprits) + f"{head}: {why}; " + "; ".join(parts)
                + (f"; waiting: {', '.join(waits)}" if waits else "")), ReplicaTimeout

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
        """Stop every host (politely when ``graceful``, then by SIGKILL); idempotent."""
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


def _inside(b):
    """A board slot with a sampled collective (``seen_collective``) as its ``in_collective``
    when the kit recorded none."""
    if b.get("in_collective") or not b.get("seen_collective"):
        return b
    return dict(b, in_collective=b["seen_collective"], since=b.get("seen_since"))


def _kit_thread(block):
    """True for a stack of this module's own host threads (parent watchdog, collective watch)."""
    here = os.path.basename(__file__)
    return any(f.func in ("watch", "_watch_collectives") and os.path.basename(f.path) == here
               for f in blame_mod.frames(block))


def _replica_stacks(dump, tid, host_tids):
    """``(stacks, collective)`` of the replica on thread ``tid`` from its host's
    faulthandler ``dump`` (with source lines), and the collective
    (:func:`conformance.worlds.blame.collective_in`) the first of those threads is inside.

    Its threads: on a host of one replica (``host_tids``: the replica threads of the
    host), every thread; on a host of several, its own, plus the threads no replica
    owns when it alone waits in backward (autograd runs an XLA device's backward,
    and its hooks, on a worker thread of its own)."""
    blocks = {t: b for t, b in dg.thread_stacks(dump).items() if not _kit_thread(b)}
    mine = blocks.get(tid) if tid else None
    if len(host_tids) <= 1:
        ordered = ([mine] if mine else []) + [b for t, b in blocks.items() if t != tid]
    elif mine is None:
        return dump, None
    else:
        ordered = [mine]
        in_backward = [t for t in host_tids if _innermost(blocks.get(t)) == "_engine_run_backward"]
        if in_backward == [tid]:
            ordered += [b for t, b in blocks.items() if t not in host_tids and _worker(b)]
    seen = next((c for c in map(blame_mod.collective_in, ordered) if c), None)
    text = "\n\n".join(dg.with_source(b) for b in ordered) if ordered else dump
    return text, seen


def _lead(parts: list[str], culprits=()) -> str:
    """The first culprit's own words as the summary's first sentence: a report's table prints
    the first sentence, which must say who failed, not which world. With several ``culprits``
    (diagnosis dicts) the sentence names them all first: the first one's words alone would
    read as if it stood out (every replica asleep, all waiting in one step sync)."""
    if not parts:
        return ""
    ranks = [str(d["rank"]) for d in culprits]
    alike = f"no single culprit, replicas {', '.join(ranks)} alike: " if len(ranks) > 1 else ""
    return f"{alike}{parts[0].rstrip('. ')}. "


def _top_frame(stacks):
    """Where a replica is, in one line: the innermost frame of its first thread that is
    neither just waiting for autograd (whose worker thread runs the backward) nor blocked
    on a ``threading`` primitive (an Event, a Condition, a queue: it waits for another
    thread of its own, e.g. a DDP's communication thread, which is where the replica is)."""
    blocks = list(dg.thread_stacks(stacks).values()) or [stacks]
    busy = [b for b in blocks if _innermost(b) != "_engine_run_backward" and not _waits_for_a_thread(b)]
    if not busy:
        busy = [b for b in blocks if _innermost(b) != "_engine_run_backward"]
    return blame_mod.top_frame((busy or blocks)[0])


def _innermost(block):
    fs = blame_mod.frames(block or "")
    return fs[0].func if fs else None


def _waits_for_a_thread(block):
    """True when the innermost frame of a stack is in the standard library's ``threading``
    module (``Event.wait``, ``Condition.wait``, ``Thread.join``, and ``queue.Queue.get`` and
    ``Future.result``, which wait through it)."""
    fs = blame_mod.frames(block or "")
    return bool(fs) and fs[0].path.replace("\\", "/").endswith("/threading.py")


def _worker(block):
    """A thread started outside Python (no ``threading`` bootstrap, not the main thread)."""
    fs = blame_mod.frames(block)
    return bool(fs) and fs[-1].func not in ("_bootstrap", "<module>")


def _mib(value):
    return "?" if value is None else f"{value:.0f} MiB"


def _first_line(text):
    text = (text or "").strip()
    return text.splitlines()[0][:300] if text else ""


class WorldPool:
    """Worlds keyed by ``(runtime, world_size)``, started on first use, replaced when broken."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings()
        self._worlds: dict[tuple[str, int], World] = {}

    def get(self, runtime: str, world_size: int) -> World:
        """The started world of ``world_size`` replicas of ``runtime``.

        Raises:
            ReplicaError / RuntimeUnavailable: as :class:`World`.
        """
        key = (runtime, world_size)
        world = self._worlds.get(key)
        if world is None or world.broken:
            world = self._worlds[key] = World(runtime, world_size, settings=self.settings, wait=False)
        world.wait_started()
        return world

    def prestart(self, runtime: str, world_size: int) -> World | None:
        """Spawn that world's hosts now, without waiting for them, so that they import the
        runtime while this process still works with another world (the PJRT default run used
        1.2 of 2 cores); :meth:`get` then returns it. Returns the world, or ``None`` when it
        cannot be started: the error is left for :meth:`get` to raise where it is reported."""
        key = (runtime, world_size)
        if key in self._worlds and not self._worlds[key].broken:
            return self._worlds[key]
        try:
            world = self._worlds[key] = World(runtime, world_size, settings=self.settings, wait=False)
        except Exception:  # unavailable runtime, bad size, spawn failure: get() reports it
            return None
        return world

    def close(self) -> None:
        for world in self._worlds.values():  # every host tears down at once, then each is reaped
            world.request_stop()
        for world in self._worlds.values():
            world.close()  # removes its work directory too
        self._worlds.clear()
