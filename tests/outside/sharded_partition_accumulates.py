"""Faulty sharded DDP (t): the owned gradient partition accumulates across optimizer steps.

Fault: as ZeRO-2 does, each rank keeps its averaged shard in a persistent partition buffer and
*adds* every reduction into it (so that reductions of several micro-batches accumulate); the
buffer is cleared only by the wrapper's own ``zero_grad()`` (as an engine's ``zero_grad`` does),
not by ``optimizer.zero_grad()``. With a plain torch optimizer the gradient of step k is the sum
of the averaged gradients of steps 1..k. Step 1 is exact.
Modelled on: deepspeedai/DeepSpeed#856 (ZeRO stage 2: reduced gradients of other partitions not
cleared before the next backward, fix for #684) https://github.com/deepspeedai/DeepSpeed/pull/856 .
Exposed by: >= 2 optimizer steps, unless the loop calls the DDP wrapper's zero_grad().
"""

import torch.distributed as dist

from .sharded_correct import ShardedCorrectDDP


class ShardedPartitionAccumulatesDDP(ShardedCorrectDDP):
    def _sharded_mean(self, b, flat, divisor):
        n, W = flat.numel(), self.world_size
        shard = self._reduced_shard(flat)
        s = shard.numel()
        shard.div_(divisor)
        parts = self.__dict__.setdefault("_partitions", {})
        if self._shadowing:
            part = shard
        elif b not in parts or parts[b].numel() != s or parts[b].dtype != shard.dtype:
            part = parts[b] = shard
        else:
            part = parts[b]
            part.add_(shard)  # the fault: never reset between optimizer steps
        out = self._gather_buffer(b, s * W, flat.dtype)
        dist.all_gather_into_tensor(out, part, group=self.process_group)
        return out[:n]

    def zero_grad(self, set_to_none=True):
        self.__dict__.pop("_partitions", None)
        super().zero_grad(set_to_none=set_to_none)
