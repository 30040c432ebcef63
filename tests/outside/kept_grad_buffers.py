"""Two faults of one design, each behind a different ``zero_grad`` mode of the training loop.

This DDP keeps its gradient buffers across steps (as a bucket-view DDP does): from the second
accumulation window on it asserts that the gradients still exist, so a loop calling
``optimizer.zero_grad(set_to_none=True)`` (torch's default) crashes every replica with an
``AssertionError``; a loop calling ``zero_grad(set_to_none=False)`` runs, but the reduced mean is
written into a zero-filled kept buffer twice (copied, then added), so every synced gradient after
a ``zero_grad(set_to_none=False)`` is doubled. The crash must not hide the doubling: the kit excludes the crashing loop
statement, draws the loop programs again and reports both. Everything else is ``CorrectDDP``.
"""
import torch

from tests.outside.correct_ddp import CorrectDDP


class KeptGradBuffersDDP(CorrectDDP):
    _windows = 0
    _window_open = False
    _zeroed = False  # this window started from zero-filled kept buffers

    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and not self._window_open:  # the first forward of a window
            self._window_open = True
            self._windows += 1
            kept = [p.grad for p in self._params if p.grad is not None]
            if self._windows > 1:
                assert kept, "KeptGradBuffersDDP: the gradient buffers were freed (zero_grad(set_to_none=True))"
            self._zeroed = bool(kept) and not any(bool(g.any()) for g in kept)
        return super().forward(*inputs, **kwargs)

    def _reduce(self):
        super()._reduce()
        self._window_open = False

    def _write_back(self, b, idx, flat, used):
        super()._write_back(b, idx, flat, used)
        if self._zeroed:
            for i in idx:
                if used[i] > 0:
                    self._params[i].grad.mul_(2)  # FAULT: the mean lands in the kept buffer twice
