"""A DDP written from scratch whose replica 1 raises ``ValueError`` in every forward.

``Class(module, **ddp_kwargs)`` broadcasts the module's parameters and buffers from rank 0 at
construction and averages gradients over replicas with an all-reduce in a
post-accumulate-grad hook, as backward produces each one. Keywords it does not implement raise
``TypeError``. On rank 1 every forward raises, so every case that trains fails: replica 0 is then
left inside the all-reduce of its first backward (or the next broadcast), which replica 1 never
enters. It measures what a failing case costs the kit (issue 26 item 1, docs/robustness.md).

Run, from the repository root::

    python -m conformance run --ddp tests.outside.raising_everywhere:Class --only parity.mlp \
        --world-size 2
"""
import torch.distributed as dist
from torch import nn

RAISING_RANK = 1


def _refuse(rank):
    raise ValueError(f"replica {rank} refuses to run forward")  # the frame the report must show


class Class(nn.Module):
    def __init__(self, module, broadcast_buffers=True, **unsupported):
        super().__init__()
        if unsupported:
            raise TypeError(f"{type(self).__name__} does not implement {sorted(unsupported)}")
        self.module = module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        for t in list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []):
            dist.broadcast(t.data, src=0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p):
        dist.all_reduce(p.grad)
        p.grad.div_(self.world_size)

    def forward(self, *args, **kwargs):
        if self.rank == RAISING_RANK:
            _refuse(self.rank)
        return self.module(*args, **kwargs)


class Dying(Class):
    """The same DDP whose replica 1 exits the process (``os._exit(3)``) in every forward: each
    failing case loses its world, which the next case must replace (docs/robustness.md)."""

    def forward(self, *args, **kwargs):
        if self.rank == RAISING_RANK:
            import os
            os._exit(3)
        return self.module(*args, **kwargs)
