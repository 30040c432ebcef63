"""Faulty sharded DDP (u): pre/post division factors with an integer post-divide.

Fault: as FSDP (fairscale#565), gradients are pre-divided by the largest power of two ``f`` with
``W % f == 0`` and ``W / f > f`` (halving the overflow risk of the summed shard) and the shard
post-divided by the rest, but the rest is computed as ``W // f``. For W = 2 (f = 2) and
W = 4 (f = 2) the product is W and both factors are powers of two: bit-exact. For W = 3
(f = 2, post = 1) the mean is divided by 2 instead of 3: gradients 1.5x too large.
Modelled on: facebookresearch/fairscale#565 and pytorch/pytorch#80456 (FSDP's pre-divide factor
is 2, not the world size, for world_size = 3)
https://github.com/pytorch/pytorch/pull/80456 .
Exposed by: world size not a power of two (W = 3); invisible at the default W = 2 (measured:
the main command exits 0 there; with --world-size 3 or 2,3,4 it exits 1, all failures at W = 3).
"""

import torch.distributed as dist

from .sharded_correct import ShardedCorrectDDP


def _predivide_factor(world):
    f = 1
    while world % f == 0 and world / f > f:
        f *= 2
    return f


class ShardedPredivideIntDDP(ShardedCorrectDDP):
    def _sharded_mean(self, b, flat, divisor):
        n, W = flat.numel(), self.world_size
        pre = _predivide_factor(divisor)
        post = divisor // pre  # the fault: should be divisor / pre
        shard = self._reduced_shard(flat / pre)
        shard.div_(post)
        out = self._gather_buffer(b, shard.numel() * W, flat.dtype)
        dist.all_gather_into_tensor(out, shard, group=self.process_group)
        return out[:n]
