"""Leaf types of ``ddp_impl`` (imported by ``ranks``, ``collectives``, ``xla`` and
``xrt``; it imports none of them, so the runtime modules never import in a circle)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankBindings:
    """One replica's view of the world; every field an ``int``."""

    process_index: int
    process_count: int
    global_ordinal: int
    local_ordinal: int
    world_size: int
    local_device_count: int


class Completed:
    """Handle of an all-reduce that is already done (or lazily recorded, on XLA)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def wait(self):
        return self.tensor
