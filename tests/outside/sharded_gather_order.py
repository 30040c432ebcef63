"""Faulty sharded DDP (s): shards gathered back in the wrong rank order.

Fault: the all-gathered shards are placed by a 1-based rank id: rank ``r``'s shard is written at
position ``(r + 1) % W`` of the flat gradient. Every replica agrees (the same wrong gradient
everywhere), so only a comparison against the single-device reference can see it.
Modelled on: pytorch/xla#3824 (all-gather / reduce-scatter results in mismatched rank order
under PJRT) https://github.com/pytorch/xla/issues/3824 .
Exposed by: parameter parity (any model whose shards differ).
"""

import torch.distributed as dist

from .sharded_correct import ShardedCorrectDDP


class ShardedGatherOrderDDP(ShardedCorrectDDP):
    def _sharded_mean(self, b, flat, divisor):
        n, W = flat.numel(), self.world_size
        shard = self._reduced_shard(flat)
        s = shard.numel()
        shard.div_(divisor)
        chunks = [flat.new_empty(s) for _ in range(W)]
        dist.all_gather(chunks, shard, group=self.process_group)
        out = self._gather_buffer(b, s * W, flat.dtype)
        for r in range(W):
            pos = (r + 1) % W  # the fault: off-by-one slot
            out[pos * s:(pos + 1) * s] = chunks[r]
        return out[:n]
