"""Faulty backend: ``all_reduce`` with ``ReduceOp.AVG`` on bfloat16 tensors is computed as a SUM
(the division by the group size is dropped); every other dtype averages, and SUM is right for
every dtype. A backend that lowers AVG to SUM followed by a divide in a per-dtype kernel table,
and misses the divide in one entry, fails like this. DDP's own gradient reduction divides
first and then sums, so it never asks for AVG and does not see this fault."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.outside.backends.wrapper import Wrapper, registrar

DTYPE = torch.bfloat16


class AvgAsSum(Wrapper):
    NAME = "avg_as_sum"

    def _as_sum(self, tensors, opts):
        if opts.reduceOp == dist.ReduceOp.AVG and any(t.dtype == DTYPE for t in tensors):
            summed = dist.AllreduceOptions()
            summed.reduceOp = dist.ReduceOp.SUM
            summed.timeout = opts.timeout
            return summed
        return opts

    def allreduce(self, tensors, opts):
        opts = self._as_sum(tensors, opts)
        return self._run("allreduce", self.gloo.allreduce(tensors, opts), tensors, opts)


register = registrar(AvgAsSum)
