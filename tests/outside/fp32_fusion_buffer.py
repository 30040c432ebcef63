"""Faulty DDP: one float32 fusion buffer for every dtype.

Fault: every bucket is packed into a float32 buffer (``torch.cat(...).float()``), all-reduced
there and copied back: float64 gradients are reduced at float32 precision (each step's update
carries float32 rounding, ~1e-8 relative), bfloat16 ones are fine. Float32 models are unaffected.
Modelled on: pytorch/PiPPy#656 (gradients of mixed-dtype stages reduced in one fusion buffer of
a single dtype) https://github.com/pytorch/PiPPy/issues/656 .
Exposed by: the float64 dtype corner (parity.float64).
"""

import torch
import torch.distributed as dist

from .correct_ddp import CorrectDDP


class Fp32FusionBufferDDP(CorrectDDP):
    def _reduce_bucket(self, b, idx, divisor):
        params = [self._params[i] for i in idx]
        flat = torch.cat([self._dense_grad(p).reshape(-1) for p in params])
        if not flat.is_complex():
            flat = flat.float()  # fault: one float32 buffer
        dist.all_reduce(flat, group=self.process_group)
        return flat.div_(divisor)
