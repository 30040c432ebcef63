"""Faulty sharded DDP (r): only the rank's own shard is scaled; the others arrive unscaled.

Fault: to overlap the all-gather with the scaling, the reduce-scatter output is handed to the
all-gather before the owner divides it by the world size (the all-gather sends that snapshot);
the owner then writes its scaled shard into its own slot. Every replica ends up with the mean in
its own shard and the *sum* in every other shard: gradients W times too large outside the own
shard, and different on every replica.
Source: constructed (the pre/post-division split of FSDP's reduce-scatter path,
pytorch/pytorch#106034, shows where the scaling sits relative to the collectives).
Exposed by: any parity check (SGD) and replica agreement.
"""

import torch.distributed as dist

from .sharded_correct import ShardedCorrectDDP


class ShardedOwnShardScaleDDP(ShardedCorrectDDP):
    def _sharded_mean(self, b, flat, divisor):
        n, W, r = flat.numel(), self.world_size, self.rank
        shard = self._reduced_shard(flat)
        s = shard.numel()
        outgoing = shard.clone()  # the fault: sent before the scaling below
        shard.div_(divisor)
        out = self._gather_buffer(b, s * W, flat.dtype)
        dist.all_gather_into_tensor(out, outgoing, group=self.process_group)
        out[r * s:(r + 1) * s] = shard  # own slot from the scaled local shard
        return out[:n]
