"""Faulty DDP (a): wrong averaging under gradient accumulation.

Fault: the synced step divides the all-reduced gradient by micro-steps x world size (as if the
accumulated sum had to be turned into a per-micro-step mean), so with ``no_sync`` accumulation
over k micro-steps the update is k times too small. Without ``no_sync`` it is exact.
Modelled on: karpathy/build-nanogpt#30 (gradient accumulation with DDP silently giving a worse
loss) https://github.com/karpathy/build-nanogpt/pull/30 and the no_sync averaging discussion in
pytorch/pytorch#21736 https://github.com/pytorch/pytorch/pull/21736 .
Exposed by: the no_sync / gradient-accumulation dimension (param parity after a synced step that
follows >= 1 no_sync micro-step). Plain parity runs cannot see it.
"""

from .correct_ddp import CorrectDDP


class AccumWrongAverageDDP(CorrectDDP):
    def forward(self, *inputs, **kwargs):
        self._micro = getattr(self, "_micro", 0) + (1 if self.training else 0)
        return super().forward(*inputs, **kwargs)

    def _reduce_bucket(self, b, idx, divisor):
        return super()._reduce_bucket(b, idx, divisor * max(1, getattr(self, "_micro", 1)))

    def _reduce(self):
        super()._reduce()
        self._micro = 0
