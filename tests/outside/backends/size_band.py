"""Faulty backend: every collective whose output tensors hold between ``LOW`` and ``HIGH``
elements is off at the middle element on every rank; smaller and larger ones are right. A
backend with a transfer path of its own for one band of message sizes (a protocol switch, a
pipelined path, a staging buffer of fixed size; jax-ml/jax#40830 was wrong for 4 MiB chunks and
right for 256 KiB) fails like this. The band lies between the sizes a fixed size cover usually
picks (powers of two and their neighbours up to 2^16 + 1, then 262147), so only a search over
the size finds it."""
from __future__ import annotations

import torch

from tests.outside.backends.wrapper import Wrapper, perturb_middle, registrar

LOW, HIGH = 70_000, 250_000


class SizeBand(Wrapper):
    NAME = "size_band"

    def fix(self, op, outputs, opts):
        for t in outputs:
            if isinstance(t, torch.Tensor) and LOW <= t.numel() <= HIGH:
                if t.is_contiguous():
                    perturb_middle(t)


register = registrar(SizeBand)
