"""Fault 25.2: each synced backward overwrites ``.grad`` with the mean of its own gradients.

Training loop dimension: several ``backward()`` calls per optimizer step, each outside
``no_sync`` (two losses, or two forwards each with its own backward).

The DDP records every parameter's gradient of the current backward with a tensor hook
(summed over ``no_sync`` backwards since the last reduction, so gradient accumulation is
right), all-reduces that sum and writes the mean over ``p.grad`` (``copy_``). torch's DDP
reduces the accumulated ``.grad`` instead, so a second synced backward before
``optimizer.step()`` adds to the first; here the first backward's (already reduced) gradient
is lost and the step follows the last backward only. With one backward per step (after ``zero_grad``) it equals ``CorrectDDP``.
"""

import torch

from tests.outside.correct_ddp import CorrectDDP


class MultiBackwardOverwriteDDP(CorrectDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._pending = {}
        for p in self._params:
            p.register_hook(self._make_capture(p))

    def _make_capture(self, p):
        key = id(p)

        def capture(grad):
            g = grad.to_dense() if grad.is_sparse else grad
            prev = self._pending.get(key)
            self._pending[key] = g.detach().clone() if prev is None else prev + g.detach()
            return grad
        return capture

    def _dense_grad(self, p):
        # FAULT: reduce this window's backward gradients only, not the accumulated p.grad
        g = self._pending.get(id(p))
        return torch.zeros_like(p) if g is None else g

    def _reduce(self):
        try:
            super()._reduce()
        finally:
            self._pending = {}
