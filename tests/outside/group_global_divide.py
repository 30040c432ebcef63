"""Faulty DDP (x): with a ``process_group``, gradients are summed over the group but divided
by the global world size.

Fault: the bucket's all-reduce runs on ``process_group`` (a process group of an HSDP-style
job), but the mean divides by ``torch.distributed.get_world_size()`` of the default group,
the "sum / world size" habit of hand-written averaging; exact whenever the group is the world.
Modelled on: pytorch/pytorch#36516 ("DDP should divide bucket contents by the number of global
replicas instead of world size": the divisor is not the count of what was summed)
https://github.com/pytorch/pytorch/issues/36516, and the ``average_gradients`` recipe of
pytorch/examples#1146 (``size = float(dist.get_world_size())``).
Exposed by: feature.subgroups (process groups of two in a world of 3 or 4).
"""

import torch.distributed as dist

from .correct_ddp import CorrectDDP


class GroupGlobalDivideDDP(CorrectDDP):
    def _reduce_bucket(self, b, idx, divisor):
        return super()._reduce_bucket(b, idx, dist.get_world_size())  # fault: not the group's size
