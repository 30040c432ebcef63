"""Faulty DDP (y): with a ``process_group``, module states are broadcast from global rank 0
over the default group instead of from the group's first rank over the group.

Fault: every broadcast calls ``dist.broadcast(tensor, src)`` without the group, so the group
rank ``src`` is read as a global rank of the whole world: at construction every process group
starts from global rank 0's parameters, not from its own first rank's (exact whenever the
group is the world).
Modelled on: meta-pytorch/torchrec#4601 ("Use group-local rank when broadcasting": a group-local
rank passed as the global ``src``) https://github.com/meta-pytorch/torchrec/pull/4601 and
pytorch/pytorch#67600 (broadcast with the wrong group silently does the wrong thing)
https://github.com/pytorch/pytorch/issues/67600.
Exposed by: feature.subgroups (a group that does not hold global rank 0).
"""

import torch.distributed as dist

from .correct_ddp import CorrectDDP


class GroupBroadcastRank0DDP(CorrectDDP):
    def _broadcast(self, tensor, group_rank):
        dist.broadcast(tensor, group_rank)  # fault: default group, group rank taken as global rank
