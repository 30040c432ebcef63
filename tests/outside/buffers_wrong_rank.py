"""Faulty DDP (f): buffers broadcast before each forward from the last rank instead of rank 0.

Fault: construction state sync is correct, but the per-forward buffer broadcast uses the last
rank as source, so every replica's running statistics follow the last replica's shard.
Modelled on: pytorch/pytorch#63916 ("Issues when using buffers with DDP": buffers not taking
rank 0's value) https://github.com/pytorch/pytorch/issues/63916 and the untested broadcast_buffers
path noted in pytorch/pytorch#63917.
Exposed by: buffer parity of a model with buffers (BatchNorm running stats), broadcast_buffers on.
"""

from .correct_ddp import CorrectDDP


class BuffersWrongRankDDP(CorrectDDP):
    def _buffer_source(self, joined):
        return self.world_size - 1
