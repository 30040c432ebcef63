"""The runtime adapter interface and the per-replica context tasks receive."""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Callable


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
        collectives: a :class:`ddp_impl.collectives.Collectives` for this replica.
        bindings: the replica's :class:`ddp_impl.ranks.RankBindings`.
        mark_step: call after each optimizer step (a no-op except on XLA, where
            it cuts and runs the lazy graph).
        extra: runtime-specific state.
    """

    runtime: str
    rank: int
    world_size: int
    device: Any
    collectives: Any
    bindings: Any
    mark_step: Callable[[], None] = lambda: None
    extra: dict = field(default_factory=dict)


class Runtime:
    """Adapter base class. Subclasses set :attr:`name` and override the hooks."""

    name = "?"
    max_world_size = 64
    # Measured ways the runtime's own ops differ from CPU PyTorch, which the
    # single-device reference must reproduce (see conformance.reference.QUIRKS).
    reference_quirks: frozenset = frozenset()

    def check(self, world_size: int) -> None:
        """Raise :class:`RuntimeUnavailable` (one line) if this world cannot run here."""
        if not 1 <= world_size <= self.max_world_size:
            raise RuntimeUnavailable(
                f"world size {world_size} is outside 1..{self.max_world_size} for runtime {self.name}")

    def host_envs(self, world_size: int) -> list[dict]:
        """One environment (``str -> str``) per host process to start."""
        raise NotImplementedError

    def setup_host(self, host: int, world_size: int, workdir: str) -> list[ReplicaContext]:
        """Initialise the runtime inside host process ``host``; return its replicas."""
        raise NotImplementedError

    def execute(self, replicas: list[ReplicaContext], fn, payload: dict) -> list[tuple]:
        """Run ``fn(ctx, **payload)`` on each replica of this host.

        Returns ``[(rank, ok, value_or_traceback_text), ...]``.
        """
        out = []
        for ctx in replicas:
            try:
                out.append((ctx.rank, True, fn(ctx, **payload)))
            except BaseException:
                out.append((ctx.rank, False, traceback.format_exc()))
        return out

    def teardown_host(self, replicas: list[ReplicaContext]) -> None:
        """Release runtime resources before the host exits."""
