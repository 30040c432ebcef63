"""Faulty DDP: gradients unpacked from the bucket through the parameter's strides.

Fault: gradients are packed into the flat bucket in logical order (``reshape(-1)``), but each
reduced gradient is read back with ``as_strided(p.shape, p.stride())``: for a ``channels_last``
conv weight or a transposed (non-contiguous) parameter the elements come back permuted.
Contiguous parameters are unaffected.
Modelled on: pytorch/pytorch#47163 (DDP's "gradient layout contract": bucket views must match
the parameter's strides, packing and unpacking alike) https://github.com/pytorch/pytorch/pull/47163 .
Exposed by: the layout corner (parity.channels_last).
"""

from .correct_ddp import CorrectDDP


class StridedUnpackDDP(CorrectDDP):
    def _write_back(self, b, idx, flat, used):
        off = 0
        for i in idx:
            p = self._params[i]
            n = p.numel()
            if used[i] > 0:
                g = flat[off:off + n].as_strided(p.shape, p.stride())  # fault: strides, not logical order
                if p.grad is None or p.grad.is_sparse:
                    p.grad = g.to(p.dtype).clone()
                else:
                    p.grad.copy_(g)
            off += n
