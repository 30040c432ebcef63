"""Faulty DDP (h): ``find_unused_parameters`` zero-fills globally unused parameters.

Fault: a parameter no replica used gets a zero gradient instead of keeping ``None``; optimizers
then treat it as used (weight decay, momentum, Adam state all move it).
Modelled on: pytorch/pytorch#28883 ("DDP should not set grad for globally unused params")
https://github.com/pytorch/pytorch/pull/28883 and the zero-vs-undefined discussion in
pytorch/pytorch#57081.
Exposed by: the unused-parameters dimension (grad of a globally unused parameter must stay None;
param parity with an optimizer that has weight decay or momentum).
"""

import torch

from .correct_ddp import CorrectDDP


class UnusedZeroFilledDDP(CorrectDDP):
    def _write_back(self, b, idx, flat, used):
        super()._write_back(b, idx, flat, used)
        for i in idx:
            p = self._params[i]
            if used[i] == 0 and p.grad is None:
                p.grad = torch.zeros_like(p)

    def _reduce(self):
        super()._reduce()
        for p in self._params:  # buckets with no used parameter at all are skipped upstream
            if p.grad is None:
                p.grad = torch.zeros_like(p)
