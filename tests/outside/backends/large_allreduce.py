"""Faulty backend: ``all_reduce`` of more than ``LIMIT`` elements is off at one element (the
middle one) on every rank, as a chunked or pipelined path that drops a rounding step or a
partial sum might be; smaller all-reduces (all a small model's DDP buckets) are right."""
from __future__ import annotations

from tests.outside.backends.wrapper import Wrapper, perturb_middle, registrar

LIMIT = 4096


class LargeAllReduce(Wrapper):
    NAME = "large_allreduce"

    def fix(self, op, outputs, opts):
        if op != "allreduce":
            return
        for t in outputs:
            if t.numel() > LIMIT:
                perturb_middle(t)


register = registrar(LargeAllReduce)
