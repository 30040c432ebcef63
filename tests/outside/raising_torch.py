"""torch's own ``DistributedDataParallel`` whose replica 1 raises ``ValueError`` in every forward.

It accepts every keyword torch's DDP accepts, so every case that trains runs and fails: what a
broken full-featured DDP costs the kit against ``--ddp torch`` (benchmarks/failure_path.py).
"""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

RAISING_RANK = 1


class RaisingTorchDDP(DistributedDataParallel):
    def forward(self, *args, **kwargs):
        if dist.get_rank() == RAISING_RANK:
            raise ValueError(f"replica {RAISING_RANK} refuses to run forward")
        return super().forward(*args, **kwargs)
