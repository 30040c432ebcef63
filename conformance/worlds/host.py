"""The host side of a spawned world: the process a :class:`conformance.worlds.spawned.World`
starts per host (:func:`host_main`, pickled by this module's path), its task loop, and the
sampling of its replicas' stacks (:func:`watch_collectives`). This module imports torch only
through the runtime, inside the host process.
"""
from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import time
import traceback

from conformance.worlds import blame as blame_mod, diagnosis as dg, isolation
from conformance.worlds.launchers import launcher_variables
from conformance.worlds.registry import register
from conformance.worlds.runtimes import get_runtime

# How often the parent reads the progress board while waiting (collective bound).
POLL_S = 0.5
# How often a host samples its replicas' stacks (the collective watch): a replica that raised
# is reported once every peer is seen waiting in a collective, which takes one sample. A sample
# walks the host's threads in microseconds (sample_stacks).
WATCH_S = 0.1
# Variables of a launcher (torchrun, srun, mpirun, ...) that a kit-spawned host must not
# inherit from its parent: they would override the host's own rank layout
# (e.g. GROUP_RANK=1 labels every replica "host 1").
SCRUBBED_LAUNCHER_VARS = tuple(sorted(set(launcher_variables()) | {
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}))


def die_with_parent(parent_pid):
    """Exit when the kit process ``parent_pid`` or the process that forked this host (the kit,
    or its fork server, which exits when the kit does) is gone."""
    try:  # Linux: the kernel kills us when the process that forked us goes.
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    forked_by = os.getppid()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def watch():
        while os.getppid() == forked_by and alive(parent_pid):
            time.sleep(1.0)
        os._exit(70)
    threading.Thread(target=watch, daemon=True, name="parent-watchdog").start()


def instrument(ctx, board, host, runtime):
    """Give a replica its progress slot; record its collectives (and XLA step syncs)."""
    ctx.progress = p = board.slot(ctx.rank, host=host, pid=os.getpid(),
                                  tid=ctx.extra.get("thread_ident") or threading.get_ident())
    ctx.collectives = dg.RecordingCollectives(ctx.collectives, p)
    if runtime.step_sync_runs_collectives:
        ctx.mark_step = dg.recorded_step_sync(ctx.mark_step, p)


def sample_stacks(skip: int) -> dict[int, str]:
    """``{thread ident: stack}`` of every thread of this process but ``skip``, innermost frame
    first, each stack in ``faulthandler``'s format (what :mod:`conformance.worlds.blame` reads).

    From ``sys._current_frames()``, under the interpreter's lock (``faulthandler.dump_traceback``,
    written for signal handlers, takes none: called often it killed hosts with SIGSEGV). The
    frames are read into strings at once and dropped before anything else: a frame still held
    keeps its function's locals alive, and on PJRT a lazy tensor kept alive that way is one more
    output of the replica's next graph (docs/runtimes/pjrt.md, cause 1)."""
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


def watch_collectives(replicas, every=WATCH_S):
    """Host thread: every ``every`` seconds, record in each running replica's progress
    the collective its stack shows (:func:`conformance.worlds.blame.collective_in`), so the
    collective bound applies to a DDP that calls torch.distributed or torch_xla itself.
    On a host of one replica every thread counts (a DDP's communication thread)."""
    me = threading.get_ident()
    while True:
        time.sleep(every)
        try:
            blocks = sample_stacks(skip=me)
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


def host_main(world, host, conn, workdir, env, parent_pid, settings, parent_env=None, registered=None):
    """Entry point of host ``host`` of ``world`` (its :class:`~conformance.worlds.registry.WorldKey`):
    drops the parent's launcher variables, logs to the host's log, ignores SIGINT, dies with its
    parent, enables ``faulthandler``, sets up the runtime's replicas, then runs tasks until told
    to stop. ``parent_env``: the kit's environment when it started this host (a host forked by the
    fork server would otherwise inherit the server's). ``registered``: ``(runtime, its registry
    entry)``, for a runtime registered after the fork server imported the registry."""
    if parent_env is not None:
        os.environ.clear()
        os.environ.update(parent_env)
    for var in SCRUBBED_LAUNCHER_VARS:  # before anything reads them (torch.distributed, ranks)
        os.environ.pop(var, None)
    log_fd = os.open(os.path.join(workdir, f"host{host}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
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
        if registered is not None:
            register(*registered)
        runtime = get_runtime(world, settings)
        replicas = runtime.setup_host(host, world.replicas, workdir)
        isolation.take_snapshot()  # what every implementation's first task finds (World.enter)
        board = dg.ProgressBoard(os.path.join(workdir, "progress"))
        for ctx in replicas:
            instrument(ctx, board, host, runtime)
        threading.Thread(target=watch_collectives, args=(replicas,), daemon=True,
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
        if msg[0] == "reset":  # ("reset", generation), see World._reset in conformance.worlds.spawned
            send(("reset", msg[1], reset_host(runtime, replicas, msg[1], workdir, stacks)))
            continue
        task_id, fn, payload = msg

        def on_raise(rank, info, task_id=task_id):  # at once, from the replica's thread
            send(("raised", task_id, rank, info))
        results = runtime.execute(replicas, fn, payload, on_raise=on_raise, task=task_id)
        send(("done", task_id, results))
    runtime.teardown_host(replicas)


def reset_host(runtime, replicas, generation, workdir, stacks):
    """Host side of :meth:`conformance.worlds.spawned.World._reset`: ``None``, or the traceback of why it failed."""
    try:
        runtime.reset_host(replicas, generation, workdir)
        isolation.retake(isolation.GROUP_ITEM)  # the kit's new group, not an implementation's change
        # the next failure's report must not read this one's stacks
        os.ftruncate(stacks.fileno(), 0)
        os.lseek(stacks.fileno(), 0, os.SEEK_SET)
    except BaseException:
        return traceback.format_exc()
    return None
