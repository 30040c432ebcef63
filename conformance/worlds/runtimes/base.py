"""The runtime adapter interface and the per-replica context tasks receive."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from conformance.settings import Settings
from conformance.worlds import isolation
from conformance.worlds.diagnosis import failure_info, task_name


class RuntimeUnavailable(RuntimeError):
    """The runtime cannot run here; ``str(exc)`` is the one-line reason."""


@dataclass
class ReplicaContext:
    """What a task running on one replica may use.

    Attributes:
        runtime: runtime name (``"cpu"``, ``"pjrt"``, ...).
        rank: global ordinal of this replica, ``0 <= rank < world_size``.
        world_size: number of replicas.
        device: the ``torch.device`` the replica computes on.
        collectives: a :class:`ddp_impl.runtime.collectives.Collectives` for this replica.
        bindings: the replica's :class:`ddp_impl.runtime.ranks.RankBindings`.
        mark_step: call after each optimizer step (a no-op except on XLA, where it cuts and runs
            the lazy graph).
        extra: runtime-specific state.
        progress: where :meth:`note` writes (a :class:`conformance.worlds.diagnosis.Progress`, set
            by the World's host; ``None`` elsewhere, and then :meth:`note` is a no-op).
    """

    runtime: str
    rank: int
    world_size: int
    device: Any
    collectives: Any
    bindings: Any
    mark_step: Callable[[], None] = lambda: None
    extra: dict = field(default_factory=dict)
    progress: Any = None

    def note(self, **fields) -> None:
        """Record where this replica is, e.g. ``ctx.note(step=3, phase="backward")``: cheap (one small
        write to shared memory); a failure report names the last values noted (any JSON-able field)."""
        if self.progress is not None:
            self.progress.update(**fields)


def torch_settings() -> dict:
    """The process-wide torch settings user code reads and a task may leave changed: default dtype,
    grad mode, anomaly mode, deterministic algorithms, intra-op threads (``{name: value}``)."""
    import torch
    return {"default dtype": torch.get_default_dtype(), "grad mode": torch.is_grad_enabled(),
            "anomaly mode": torch.is_anomaly_enabled(),
            "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
            "intra-op threads": torch.get_num_threads()}


def restore_torch_settings(saved: dict) -> None:
    """Put back what :func:`torch_settings` returned (only what changed): a DDP that leaks a setting
    fails its own case, not the next implementation's in the same world."""
    import torch
    now = torch_settings()
    setters = {"default dtype": torch.set_default_dtype, "grad mode": torch.set_grad_enabled,
               "anomaly mode": torch.autograd.set_detect_anomaly,
               "deterministic algorithms": torch.use_deterministic_algorithms,
               "intra-op threads": torch.set_num_threads}
    for key, value in saved.items():
        if now[key] != value:
            setters[key](value)


def run_task(ctx: ReplicaContext, fn, payload: dict, on_raise=None, task=None) -> tuple:
    """Run ``fn(ctx, **payload)`` on one replica; return ``(rank, ok, value)``.

    On an exception ``value`` is :func:`conformance.worlds.diagnosis.failure_info` (type, message,
    traceback, step/phase/last collective), and ``on_raise(rank, value)`` is called at once, before
    the other replicas finish (they may be blocked in a collective this one left). The
    process-wide torch settings (:func:`torch_settings`) are put back after the task, whatever it left;
    the replica thread's part of the world's snapshot (:mod:`conformance.worlds.isolation`) is
    taken before its first task.
    """
    isolation.thread_snapshot()
    p = ctx.progress
    if p is not None:
        p.begin(task, task_name(fn, payload))
    saved = torch_settings()
    try:
        value = fn(ctx, **payload)
    except BaseException as exc:
        restore_torch_settings(saved)
        info = failure_info(exc, p)
        if p is not None:
            p.update(state="raised")
        if on_raise is not None:
            try:
                on_raise(ctx.rank, info)
            except Exception:  # a closed pipe: the parent is gone or tearing down
                pass
        return ctx.rank, False, info
    restore_torch_settings(saved)
    if p is not None:
        p.update(state="returned")
    return ctx.rank, True, value


class Runtime:
    """Adapter base class. Subclasses set :attr:`name` and override the hooks.

    Its facts are the class attributes named in :data:`FACTS` (docs/extending.md "A new runtime"
    says what each means): the faces read them by runtime name before any world starts, through
    :mod:`conformance.worlds.registry` (:mod:`conformance.settings` serves them).
    """

    name = "?"
    FACTS = ("max_world_size", "default_world_sizes", "default_impls", "hosts_field", "topologies",
             "launchable", "collectives_judged", "make_process_group", "reference_quirks", "uniform_graphs",
             "compiled_graphs", "step_sync_runs_collectives", "collective_bound", "resettable")
    max_world_size = 64  # a larger --world-size is refused before torch loads
    # 2, and 3 because divisor faults cancel at powers of two (an FSDP-style pre/post divide by 2
    # and W // 2 is exact at W=2 and 4, 1.5x off at 3: tests/outside/sharded_predivide_int.py).
    default_world_sizes: tuple = (2, 3)
    default_impls: tuple = ("ref",)
    hosts_field: str | None = None  # the Settings field of its emulated hosts, ((W, H), ...)
    # {topology: "module:Class"}: a Runtime built with the world's device count, whose world is
    # named <runtime>_<topology>:<W> (WorldKey.world); not selectable with --runtime.
    topologies: dict = {}
    launchable = False  # one replica per launched process (conformance.worlds.launched)
    collectives_judged = False  # by the collective family's cases, op by op
    # make_process_group(ctx, groups): this replica's group for ``groups`` (lists of global ranks;
    # every rank calls it with the same groups), which a DDP takes as process_group.
    make_process_group = None
    reference_quirks: frozenset = frozenset()  # see conformance.cases.shared.reference.QUIRKS
    # XLA's in-process CPU collectives (docs/runtimes/pjrt.md, cause 1): generated scenarios then
    # keep batch sizes and control flow equal across replicas.
    uniform_graphs: bool = False
    compiled_graphs: bool = False  # generated examples then draw their shapes from a few that repeat
    step_sync_runs_collectives = False  # XLA: collectives are lazy and run (and block) in ctx.mark_step
    # Below the runtime's own collective timeout, so the World names a peer that is elsewhere
    # instead of reporting the waiter's timeout error or abort (None: only the task timeout).
    collective_bound: float | None = None
    resettable = False  # by reset_host, instead of being replaced (see the World's reset)
    # The run's configuration (conformance.settings.Settings), set by get_runtime.
    settings: Settings = Settings()

    def backend_label(self) -> str:
        """The name the collective family's verdicts carry in place of a DDP's: the
        communication layer beneath every DDP on this runtime."""
        return self.name

    def check(self, world_size: int) -> None:
        """Raise :class:`RuntimeUnavailable` (one line) if this world cannot run here."""
        # 1 is a world here (its verdicts are vacuous); the faces refuse it before (options.py)
        if world_size < 1:
            raise RuntimeUnavailable(f"world size {world_size} < 1")
        if world_size > self.max_world_size:
            raise RuntimeUnavailable(f"world size {world_size} is above {self.max_world_size}, the largest "
                                     f"runtime {self.name} runs")

    def host_envs(self, world_size: int) -> list[dict]:
        """One environment (``str -> str``) per host process to start."""
        raise NotImplementedError

    def setup_host(self, host: int, world_size: int, workdir: str) -> list[ReplicaContext]:
        """Initialise the runtime inside host process ``host``; return its replicas."""
        raise NotImplementedError

    def execute(self, replicas: list[ReplicaContext], fn, payload: dict, on_raise=None,
                task=None) -> list[tuple]:
        """Run ``fn(ctx, **payload)`` on each replica of this host (see :func:`run_task`):
        ``[(rank, ok, value_or_failure_info), ...]``."""
        return [run_task(ctx, fn, payload, on_raise, task) for ctx in replicas]

    def teardown_host(self, replicas: list[ReplicaContext]) -> None:
        """Release runtime resources before the host exits."""

    def reset_host(self, replicas: list[ReplicaContext], generation: int, workdir: str) -> None:
        """Drop this host's communication state (its peers blocked in it then fail out of
        their collectives) and rendezvous anew (``generation``: a fresh rendezvous name)."""
        raise NotImplementedError
