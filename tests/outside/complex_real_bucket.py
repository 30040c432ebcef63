"""Faulty DDP: complex gradients copied into a real bucket.

Fault: the flat bucket is allocated with the parameters' real dtype (``p.real.dtype``:
complex64 -> float32) and gradients are copied in; a complex gradient loses its imaginary part
(torch warns and discards it), so the reduced gradient of a complex parameter is real.
Modelled on: pytorch/pytorch#158753 (complex parameters in a DDP/FSDP gradient reduction
whose buffer is real) https://github.com/pytorch/pytorch/issues/158753 .
Exposed by: the complex dtype corner (parity.complex64).
"""

import warnings

import torch
import torch.distributed as dist

from .correct_ddp import CorrectDDP


class ComplexRealBucketDDP(CorrectDDP):
    def _reduce_bucket(self, b, idx, divisor):
        params = [self._params[i] for i in idx]
        dtype = params[0].real.dtype  # fault: a complex parameter's real dtype
        flat = torch.zeros(sum(p.numel() for p in params), dtype=dtype)
        off = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Casting complex values to real discards the imaginary part"
            for p in params:
                flat[off:off + p.numel()].copy_(self._dense_grad(p).reshape(-1))
                off += p.numel()
        dist.all_reduce(flat, group=self.process_group)
        return flat.div_(divisor)
