"""Faulty backend: ``all_gather`` (list form) fills the output list in reverse rank order.

The tensor form (``all_gather_into_tensor``) is right: a kit that checks one form only misses it.
"""
from __future__ import annotations

from tests.outside.backends.wrapper import Wrapper, registrar


class GatherOrder(Wrapper):
    NAME = "gather_order"

    def fix(self, op, outputs, opts):
        if op == "allgather" and len(outputs) > 1:
            flipped = [t.clone() for t in reversed(outputs)]
            for t, f in zip(outputs, flipped):
                t.copy_(f)


register = registrar(GatherOrder)
