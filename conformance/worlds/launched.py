"""A world whose replicas were started by an external launcher (torchrun, env://).

Past one machine, starting processes is the launcher's job: ``torchrun --nnodes=N
--nproc-per-node=P`` starts ``N * P`` processes, one per replica, and tells each its place in
the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``,
``MASTER_ADDR``/``MASTER_PORT``). Every launched process runs the same code and builds one
:class:`ExternalWorld` from that environment instead of spawning anything: it initialises a gloo
group with :func:`ddp_impl.init_process_group` (``env://``) and is itself one replica (the
:class:`~conformance.worlds.runtimes.base.ReplicaContext` the CPU runtime builds).
:class:`ExternalPool` is the :class:`~conformance.worlds.pool.Pool` a
:class:`conformance.evaluate.Session` takes.

Only the CPU runtime (plain PyTorch, gloo) runs under an external launcher. Control
collectives use their own gloo group, never the default group the DDP under test uses: a
replica that raised mid-step cannot pair its gather with another replica's pending all-reduce.
"""
from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import socket
import sys
import threading
import traceback

from conformance.settings import Settings
from conformance.worlds.blame import collective_in
from conformance.worlds.diagnosis import blank as blank_diagnosis, details as diagnosis_details
from conformance.worlds.failure import ReplicaDied, ReplicaError, ReplicaFailed, ReplicaTimeout, first_line
from conformance.worlds import isolation
from conformance.worlds.host import die_with_parent
from conformance.worlds.pool import Pool
from conformance.worlds.runtimes import (RUNTIMES, RuntimeUnavailable, WorldKey, check_world, get_runtime,
                                         runtime_class)
from conformance.worlds.runtimes.base import ReplicaContext
from conformance.worlds.runtimes.cpu import process_group_timeout_s, resolve_backend

# What a launcher must set (torchrun does; so do most cluster launchers that speak env://).
# MASTER_PORT defaults in gloo.
REQUIRED_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


def external_runtimes() -> tuple[str, ...]:
    """Runtimes an external launcher can drive (one replica per launched process): those whose
    adapter sets ``launchable``."""
    return tuple(r for r in RUNTIMES if runtime_class(r).launchable)


class LauncherEnvError(RuntimeError):
    """The process was not started by an env:// launcher; ``str(exc)`` is one line."""


class WorldSizeMismatch(ValueError):
    """A world size other than the launcher's was asked for; ``str(exc)`` is one line."""


def launcher_env() -> dict | None:
    """The launcher's variables when ``REQUIRED_LAUNCHER_VARS`` are all set, else ``None``."""
    if not all(os.environ.get(v) for v in REQUIRED_LAUNCHER_VARS):
        return None
    keys = REQUIRED_LAUNCHER_VARS + ("MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                                     "TORCHELASTIC_RUN_ID")
    return {k: os.environ[k] for k in keys if k in os.environ}


def launched() -> bool:
    """True when this process was started by an env:// launcher (see :data:`REQUIRED_LAUNCHER_VARS`)."""
    return launcher_env() is not None


def launcher_world_size() -> int:
    """``WORLD_SIZE`` of the launcher that started this process.

    Raises:
        LauncherEnvError: not launched, or the variables are not integers / inconsistent (one line).
    """
    env = os.environ
    missing = [v for v in REQUIRED_LAUNCHER_VARS if not env.get(v)]
    if missing:
        raise LauncherEnvError(
            f"not started by an env:// launcher ({', '.join(missing)} not set); start every process "
            f"with torchrun, e.g. torchrun --nnodes=2 --nproc-per-node=2 ... -m conformance ...")
    try:
        rank, size, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
    except ValueError:
        raise LauncherEnvError(f"launcher variables are not integers: RANK={env['RANK']!r} "
                               f"WORLD_SIZE={env['WORLD_SIZE']!r} LOCAL_RANK={env['LOCAL_RANK']!r}") from None
    if not 0 <= rank < size or local < 0:
        raise LauncherEnvError(f"inconsistent launcher variables: RANK={rank} WORLD_SIZE={size} LOCAL_RANK={local}")
    return size


def check_external(runtime: str, world_size: int | None = None) -> int:
    """Validate an external world of ``runtime`` (and ``world_size``); return the launcher's size.

    Raises:
        LauncherEnvError, WorldSizeMismatch, RuntimeUnavailable: one line each.
    """
    size = launcher_world_size()
    if runtime not in external_runtimes():
        raise RuntimeUnavailable(f"runtime {runtime} cannot run under an external launcher "
                                 f"(only {', '.join(external_runtimes())}: one replica per launched process)")
    if world_size is not None and world_size != size:
        raise WorldSizeMismatch(f"the launcher started {size} processes (WORLD_SIZE={size}), so the world "
                                f"has {size} replicas, not {world_size}")
    check_world(WorldKey(runtime, size))
    return size


class ExternalWorld:
    """The world of replicas an external launcher started; this process is one of them.

    Same API as :class:`conformance.worlds.spawned.World`, except that :meth:`run` returns the
    results on rank 0 only (``None`` on the others; rank 0 evaluates, and :meth:`broadcast` shares
    its verdict). Every process must construct it and call :meth:`run` with the same tasks in the
    same order (the launcher runs the same program everywhere, so it does). A task is bounded by
    ``settings.replica_timeout`` s: a replica waits at most this long for the others at the result
    gather, and one still inside the task after this long prints its Python stacks to stderr.
    The default group the DDP under test uses is bounded by
    :func:`conformance.worlds.runtimes.cpu.process_group_timeout_s` (above the task bound, so a
    stuck replica's stacks are printed before a waiting peer's gloo timeout fires).

    Args:
        runtime: ``"cpu"`` (the only one, see :func:`external_runtimes`).
        settings: the run's :class:`~conformance.settings.Settings`.

    Raises:
        LauncherEnvError: the process was not started by an env:// launcher.
        RuntimeUnavailable: ``runtime`` cannot run under a launcher.
        RuntimeError: the rendezvous failed (within the group timeout).
    """

    def __init__(self, runtime: str = "cpu", settings: Settings | None = None):
        import torch
        import torch.distributed as dist

        import ddp_impl

        settings = settings or Settings()
        self.runtime = runtime
        self.timeout = settings.replica_timeout
        self.broken = False
        self.world_size = check_external(runtime)
        self.env = launcher_env()
        self._groups: dict[float, object] = {}
        self._tasks = 0
        # The launcher owns this process: die with it rather than wait in gloo.
        die_with_parent(os.getppid())
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: stacks on stderr
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            ddp_impl.init_process_group(resolve_backend(settings.backend), init_method="env://",
                                        timeout=datetime.timedelta(seconds=process_group_timeout_s(settings)))
        b = ddp_impl.runtime.ranks.bindings()
        if (b.process_count, b.global_ordinal) != (self.world_size, int(self.env["RANK"])):
            raise RuntimeError(f"torch.distributed is initialised with rank {b.global_ordinal} of "
                               f"{b.process_count}, the launcher says RANK={self.env['RANK']} "
                               f"WORLD_SIZE={self.world_size}")
        self.rank = b.global_ordinal
        self.ctx = ReplicaContext(runtime=runtime, rank=b.global_ordinal, world_size=b.world_size,
                                  device=torch.device("cpu"), collectives=ddp_impl.TorchDistributedCollectives(),
                                  bindings=b)
        me = {"rank": self.rank, "local_rank": b.local_ordinal, "host": os.environ.get("GROUP_RANK", "0"),
              "hostname": socket.gethostname(), "pid": os.getpid()}
        self.members = [None] * self.world_size
        dist.all_gather_object(self.members, me, group=self._control(self.timeout))
        self.subject = None  # as World.subject
        from conformance.worlds import preload  # what a spawned host has imported before its snapshot
        preload.import_modules()
        isolation.take_snapshot()

    def retire(self) -> None:
        """As :meth:`conformance.worlds.spawned.World.retire`; a launched world cannot be started
        anew, so its next task raises (relaunch it)."""
        self.broken = True

    # --- running tasks ---------------------------------------------------
    @property
    def is_root(self) -> bool:
        """True on rank 0, the process that receives results and evaluates."""
        return self.rank == 0

    def _control(self, timeout: float):
        """The gloo control group bounded by ``timeout`` (created collectively, cached)."""
        import torch.distributed as dist
        key = float(timeout)
        if key not in self._groups:
            self._groups[key] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=key))
        return self._groups[key]

    def run(self, fn, timeout: float | None = None, **payload) -> list | None:
        """Run ``fn(ctx, **payload)`` on this replica; gather every replica's result to rank 0.

        Returns:
            On rank 0 the results by global ordinal; ``None`` on every other rank.

        Raises (on every rank alike, and the world is then broken):
            ReplicaFailed: some replica raised (the message holds every traceback).
            ReplicaTimeout: some replica did not deliver within ``timeout`` seconds (a stuck one
                dumps its stacks to stderr).
            ReplicaDied: a peer vanished (connection closed) during the gather.
        """
        if self.broken:
            raise ReplicaError(f"{self.describe()} is broken by an earlier failure; an externally "
                               f"launched world cannot be restarted (relaunch it)")
        limit = float(timeout or self.timeout)
        self._tasks += 1
        group = self._control(limit)
        # A replica still in the task when its timeout expires dumps its Python stacks to stderr
        # (the launcher shows them) before the others' gather times out: the stuck one names itself.
        watchdog = threading.Timer(limit, self._dump_stacks, args=(self._tasks, fn, limit))
        watchdog.daemon = True
        watchdog.start()
        try:
            [(rank, ok, value)] = get_runtime(self.runtime).execute([self.ctx], fn, payload)
        finally:
            watchdog.cancel()
        if not ok:  # the launcher's log shows it at once, not only after the gather
            value = dict(value, rank=rank, host=self.members[rank]["host"], pid=os.getpid())
            print(f"--- replica {rank} raised in task {self._tasks}:\n{value['traceback']}", flush=True,
                  file=sys.stderr)
        gathered, errors = self._gather(ok, value, group, fn, limit)
        if errors:
            self.broken = True
            raise self._raised(errors)
        return [v for _, v in gathered] if self.is_root else None

    def _gather(self, ok, value, group, fn, limit) -> tuple[list | None, list | None]:
        """Gather every replica's ``(ok, value)`` to rank 0 and broadcast the failures back:
        ``(the gathered pairs on rank 0, else None; the failures' infos, or None)``.

        Raises:
            ReplicaTimeout / ReplicaDied: the gather or the broadcast failed (a replica stuck past
                ``limit`` seconds, or gone); the world is then broken.
        """
        import torch.distributed as dist
        gathered = [None] * self.world_size if self.is_root else None
        try:
            dist.gather_object((ok, value), gathered, dst=0, group=group)
            status = [([v for good, v in gathered if not good] or None) if self.is_root else None]
            dist.broadcast_object_list(status, src=0, group=group)
        except Exception as exc:
            self.broken = True
            text = f"{type(exc).__name__}: {exc}".strip()[:500]
            task = f"task {self._tasks} ({getattr(fn, '__name__', fn)})"
            if "timeout" in text.lower() or "timed out" in text.lower():
                raise ReplicaTimeout(
                    f"{self.describe()}: {task}: not every replica delivered its result within "
                    f"{limit:.0f} s (a stuck replica printed its stacks to the launcher's stderr): "
                    f"{text}") from None
            raise ReplicaDied(f"{self.describe()}: {task}: a replica vanished (exited or was killed) "
                              f"before delivering its result; see the launcher's log: {text}") from None
        return gathered, status[0]

    def _raised(self, errors: list[dict]) -> ReplicaFailed:
        """The :class:`ReplicaFailed` of the replicas that raised (``errors``: their infos)."""
        keys = ("host", "pid", "exception_type", "exception_message", "traceback")
        diag = [blank_diagnosis(v["rank"]) | {k: v.get(k) for k in keys}
                | {"status": "raised", "culprit": True, "task": self._tasks} for v in errors]
        head = "; ".join(f"replica {d['rank']} raised {d['exception_type']}: {first_line(d['exception_message'])}"
                         for d in diag)
        return ReplicaFailed(f"{self.describe()}: {len(diag)} replica(s) raised; {head}\n"
                             + diagnosis_details(diag), diag)

    def _dump_stacks(self, task, fn, limit):
        me = threading.get_ident()  # the watchdog: not evidence
        stacks = ["Traceback (most recent call last):\n" + "".join(traceback.format_stack(f))
                  for tid, f in sys._current_frames().items() if tid != me]
        seen = next((c for c in map(collective_in, stacks) if c), None)
        verdict = (f"it waits in {seen} (a peer has not reached it)" if seen else
                   "it is outside any collective (if a peer waits in one, this replica is the culprit)")
        sys.stderr.write(f"--- replica {self.rank} (host {self.members[self.rank]['host']}, pid {os.getpid()}) "
                         f"is still in task {task} ({getattr(fn, '__name__', fn)}) after its {limit:.0f} s "
                         f"timeout; {verdict}; its Python stacks:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(sys.stderr, all_threads=True)

    def broadcast(self, obj, src: int = 0):
        """Return rank ``src``'s ``obj`` on every rank (bounded by the world's timeout)."""
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self._control(self.timeout))
        return box[0]

    # --- lifecycle -------------------------------------------------------
    def describe(self) -> str:
        return (f"{self.runtime} world of {self.world_size} replica(s) started by an external launcher "
                f"(this is replica {getattr(self, 'rank', '?')})")

    def launch_info(self) -> dict:
        """What the launcher built: for the JSON report."""
        hosts = sorted({m["host"] for m in self.members}, key=str)
        return {"launcher": "env", "runtime": self.runtime, "world_size": self.world_size,
                "nnodes": len(hosts),
                "master": f"{self.env.get('MASTER_ADDR')}:{self.env.get('MASTER_PORT', '')}",
                "members": self.members}

    def pids(self) -> list[int]:
        return [m["pid"] for m in self.members]

    def close(self) -> None:
        """Destroy the process group if this world created it; idempotent."""
        import torch.distributed as dist
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._groups.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ExternalPool(Pool):
    """The :class:`~conformance.worlds.pool.Pool` of the one launcher-built world: ``get(world)``
    returns it (constructed on first use) when ``world`` is the launch's runtime and size; anything
    else raises :class:`WorldSizeMismatch` / ``RuntimeUnavailable`` - a launched world has exactly
    the launcher's processes. A broken world cannot be replaced. A task's results reach the root
    process only (:attr:`sees_every_result` is false)."""

    sees_every_result = False

    def __init__(self, runtime: str = "cpu", settings: Settings | None = None):
        check_external(runtime)
        self.runtime = runtime
        self.settings = settings or Settings()
        self.world: ExternalWorld | None = None

    @property
    def is_root(self) -> bool:
        return self.world.is_root if self.world is not None else int(os.environ["RANK"]) == 0

    def get(self, world: WorldKey) -> ExternalWorld:
        if world.world != self.runtime:
            raise RuntimeUnavailable(f"this launch runs runtime {self.runtime}, not {world.world}")
        check_external(world.runtime, world.replicas)
        if self.world is None:
            self.world = ExternalWorld(world.runtime, settings=self.settings)
        elif self.world.broken:
            raise ReplicaError(f"{self.world.describe()} is broken by an earlier failure; relaunch it")
        return self.world

    def broadcast(self, obj, src: int = 0):
        """Rank ``src``'s ``obj`` on every rank (``obj`` itself when no world was built)."""
        return self.world.broadcast(obj, src) if self.world is not None else obj

    def close(self) -> None:
        if self.world is not None:
            self.world.close()


def root_decides(pool, decide) -> int:
    """Run ``decide() -> exit code`` on the root process only; return its code on every rank.

    ``pool`` is a :class:`~conformance.worlds.pool.Pool`: of one process (a
    :class:`~conformance.worlds.pool.WorldPool`: just calls ``decide``), or an :class:`ExternalPool`
    (rank 0 decides - prints, writes the report - and broadcasts the code, so every launched
    process exits alike). If ``decide`` raises on the root, every rank gets 1 and the root re-raises.
    """
    code, error = None, None
    if pool.is_root:
        try:
            code = decide()
        except BaseException as exc:  # still tell the others, then fail loudly here
            code, error = 1, exc
    code = pool.broadcast(code)
    if error is not None:
        raise error
    return code
