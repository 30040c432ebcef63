"""Faulty backend: ``all_reduce`` of more than ``LIMIT`` elements is off at one element (the
middle one) on every rank, as a chunked or pipelined path that drops a rounding step or a
partial sum might be; smaller all-reduces (all a small model's DDP buckets) are right."""
from __future__ import annotations

import torch

from tests.outside.backends.wrapper import Wrapper, registrar

LIMIT = 4096


class LargeAllReduce(Wrapper):
    NAME = "large_allreduce"

    def fix(self, op, outputs, opts):
        if op != "allreduce":
            return
        for t in outputs:
            if t.numel() > LIMIT:
                flat = t.view(-1)
                i = t.numel() // 2
                if t.dtype == torch.bool:
                    flat[i] = ~flat[i]
                elif t.is_floating_point() or t.is_complex():
                    flat[i] += 0.0625 * (flat[i].abs() + 1)
                else:
                    flat[i] += 1


register = registrar(LargeAllReduce)
