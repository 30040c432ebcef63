"""Faulty sharded DDP (q): shard boundaries by floor division, the tail is never reduced.

Fault: the shard length is ``numel // W`` (no padding), so the reduce-scatter and all-gather
cover only the first ``W * (numel // W)`` elements of each flat gradient bucket; the last
``numel % W`` elements keep the replica's local gradient (never averaged, different on every
replica). Exact whenever every bucket's numel is a multiple of W.
Modelled on: NVIDIA/Megatron-LM#561 (``shard_buffer`` cuts ``numel // dp_size`` shards and
relies on "good numbers"; the divisibility assertion was all that kept it correct)
https://github.com/NVIDIA/Megatron-LM/issues/561 .
Exposed by: world size (a bucket numel not divisible by W) and replica agreement. Measured: at
W = 2 only the property family sees it (odd tensor shapes); every training case (parity,
features, scenarios) passes, its buckets being even-sized; at W = 3 most cases fail.
"""

import torch.distributed as dist

from .sharded_correct import ShardedCorrectDDP


class ShardedFloorTailDDP(ShardedCorrectDDP):
    def _sharded_mean(self, b, flat, divisor):
        n, W = flat.numel(), self.world_size
        s = n // W  # the fault: floor, no padding
        out = self._gather_buffer(b, n, flat.dtype)
        if s:
            shard = flat.new_empty(s)
            dist.reduce_scatter_tensor(shard, flat[:s * W].contiguous(),
                                       group=self.process_group)
            shard.div_(divisor)
            body = flat.new_empty(s * W)
            dist.all_gather_into_tensor(body, shard, group=self.process_group)
            out[:s * W] = body
        out[s * W:] = flat[s * W:]  # tail: the local, unreduced gradient
        return out
