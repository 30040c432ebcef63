"""Faulty backend: every collective whose output tensors hold between ``LOW`` and ``HIGH``
elements is off at the middle element on every rank; smaller and larger ones are right. A
backend with a transfer path of its own for one band of message sizes (a protocol switch, a
pipelined path, a staging buffer of fixed size; jax-ml/jax#40830 was wrong for 4 MiB chunks and
right for 256 KiB) fails like this. The band lies between the sizes a fixed size cover usually
picks (powers of two and their neighbours up to 2^16 + 1, then 262147), so only a search over
the size finds it."""
from __future__ import annotations

import torch

from tests.outside.backends.wrapper import Wrapper, registrar

LOW, HIGH = 70_000, 250_000


class SizeBand(Wrapper):
    NAME = "size_band"

    def fix(self, op, outputs, opts):
        for t in outputs:
            if isinstance(t, torch.Tensor) and LOW <= t.numel() <= HIGH:
                if not t.is_contiguous():
                    continue
                flat = t.view(-1)
                i = t.numel() // 2
                if t.dtype == torch.bool:
                    flat[i] = ~flat[i]
                elif t.is_floating_point() or t.is_complex():
                    flat[i] += 0.0625 * (flat[i].abs() + 1)
                else:
                    flat[i] += 1


register = registrar(SizeBand)
