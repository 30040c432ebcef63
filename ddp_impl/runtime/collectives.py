"""The small collective interface the reference DDP is written against.

One interface, several runtimes: :class:`TorchDistributedCollectives` (any
``torch.distributed`` backend, gloo on CPU) here, and an XLA implementation in
:mod:`ddp_impl.runtime.xla` for PJRT. Every method works in place on a tensor of any
shape and floating dtype and returns that tensor, like ``torch.distributed``.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from ddp_impl.runtime import ranks
from ddp_impl.runtime.types import Completed  # noqa: F401  (re-exported)


@runtime_checkable
class Collectives(Protocol):
    """Collectives over the replicas of one world.

    Attributes:
        rank: this replica's global ordinal, ``0 <= rank < world_size``.
        world_size: number of replicas taking part.
    """

    rank: int
    world_size: int

    def all_reduce_(self, tensor: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        """Sum ``tensor`` over all replicas in place, then multiply by ``scale``."""

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite ``tensor`` in place with replica ``src``'s value."""

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Return every replica's ``tensor``, indexed by rank (same shape/dtype)."""

    def barrier(self) -> None:
        """Block until every replica has reached the barrier."""

    # Optional: ``sync()`` runs pending (lazy) collectives so their results can be
    # read on the host; implementations whose collectives are eager omit it
    # (:class:`ddp_impl.runtime.xla.XlaCollectives` has it: a step sync).
    # Optional: ``all_reduce_many(tensors, *, scale=1.0) -> list`` returns each
    # tensor summed over replicas and scaled, as new tensors; the reference DDP then
    # reduces a bucket as that list instead of packing a flat buffer (lazy XLA).
    # Optional: ``all_reduce_async_(tensor, *, scale=1.0)`` starts the same
    # all-reduce and returns a handle whose ``wait()`` completes it (sum, then
    # scale) and returns ``tensor``; the tensor must not be touched before. Without
    # it :func:`all_reduce_async` falls back to the blocking ``all_reduce_``.
    # Optional: ``broadcast_many_(tensors, src=0)`` overwrites every tensor of the list with
    # replica ``src``'s value in few collectives; without it :func:`broadcast_many` calls
    # ``broadcast_`` once per tensor.


class _Pending:
    """Handle of a torch.distributed ``async_op=True`` all-reduce; applies the scale on wait."""

    def __init__(self, work, tensor, scale):
        self.work, self.tensor, self.scale = work, tensor, scale

    def wait(self):
        self.work.wait()
        if self.scale != 1.0:
            self.tensor.mul_(self.scale)
        return self.tensor


def all_reduce_async(collectives, tensor, *, scale=1.0):
    """Start ``collectives``' all-reduce of ``tensor`` (sum, then ``scale``); return
    a handle with ``wait()``. Uses the optional ``all_reduce_async_`` method when the
    collectives have it, else the blocking ``all_reduce_`` and a completed handle."""
    start = getattr(collectives, "all_reduce_async_", None)
    if start is not None:
        return start(tensor, scale=scale)
    return Completed(collectives.all_reduce_(tensor, scale=scale))


def broadcast_many(collectives, tensors, src=0) -> None:
    """Overwrite each tensor of ``tensors`` in place with replica ``src``'s value: the optional
    ``broadcast_many_`` when ``collectives`` has it, else one ``broadcast_`` per tensor."""
    many = getattr(collectives, "broadcast_many_", None)
    if many is not None:
        many(tensors, src)
        return
    for t in tensors:
        collectives.broadcast_(t, src)


def coalesce_by_dtype(tensors) -> list[list[torch.Tensor]]:
    """``tensors`` (dense) grouped by dtype and device, each group in the list's order, the
    groups in the order of their first tensor (upstream packs module states per dtype too:
    ``torch/distributed/utils.py`` ``_sync_params_and_buffers`` -> ``_broadcast_coalesced``)."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


class TorchDistributedCollectives:
    """:class:`Collectives` on an initialised ``torch.distributed`` process group.

    Args:
        group: process group (``None`` = the default group). ``rank``,
            ``world_size`` and every ``src`` are ranks within it.

    Raises:
        RuntimeError: if ``torch.distributed`` is not initialised.
    """

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised; call "
                "ddp_impl.init_process_group() first")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def all_reduce_(self, tensor, *, scale=1.0):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        if scale != 1.0:
            tensor.mul_(scale)
        return tensor

    def all_reduce_async_(self, tensor, *, scale=1.0):
        """``all_reduce_`` with ``async_op=True``: returns a handle; ``wait()`` it."""
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return _Pending(work, tensor, scale)

    def broadcast_(self, tensor, src=0):
        # src is a rank *of the group* (as ``self.rank``): upstream DDP broadcasts from the
        # group's rank 0, not global rank 0 (torch.distributed's ``group_src``).
        dist.broadcast(tensor, group=self.group, group_src=src)
        return tensor

    def broadcast_many_(self, tensors, src=0):
        """One broadcast per dtype of ``tensors`` (dense, as module states are; each group packed
        into one flat tensor), as upstream DDP's coalesced module-state and buffer broadcasts.
        Each tensor keeps its own object and layout (the values are copied back in place)."""
        for group in coalesce_by_dtype(tensors):
            if len(group) == 1:
                self.broadcast_(group[0], src)
                continue
            flat = torch.cat([t.reshape(-1) for t in group])
            self.broadcast_(flat, src)
            if self.rank != src:
                for t, part in zip(group, flat.split([t.numel() for t in group])):
                    # through .data, as upstream's C++ copy-back: the version counter stays, so a
                    # buffer a pending backward saved (position ids under an Embedding) stays valid
                    t.data.copy_(part.view(t.shape))

    def all_gather(self, tensor):
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(out, tensor.contiguous(), group=self.group)
        return out

    def barrier(self):
        dist.barrier(group=self.group)


def default_collectives() -> Collectives:
    """Collectives for the runtime this replica runs on.

    PJRT replicas (torch_xla imported and ``PJRT_DEVICE`` set) get the XLA
    implementation, everything else ``torch.distributed``'s default group.

    Raises:
        RuntimeError: if no runtime is initialised.
    """
    if ranks.current_runtime() == "pjrt":
        from ddp_impl.runtime.xla import XlaCollectives
        return XlaCollectives()
    return TorchDistributedCollectives()
