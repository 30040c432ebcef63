"""Faulty DDP (g): ``no_sync()`` whose effect leaks into the next synced step.

Fault: leaving ``no_sync`` re-enables synchronisation only after one more backward, so the first
backward that should reduce the accumulated gradients does not; replicas step on local sums.
Modelled on: karpathy/build-nanogpt#30 and facebookresearch/ClassyVision#706 (no_sync scope
placed so that the synchronising micro-step is not synchronised)
https://github.com/facebookresearch/ClassyVision/pull/706 .
Exposed by: the no_sync dimension (param parity after an accumulation window); also replica
agreement (replicas diverge).
"""

import contextlib

import torch

from .correct_ddp import CorrectDDP


class NoSyncStickyDDP(CorrectDDP):
    _sticky = False
    _resume_queued = False

    @contextlib.contextmanager
    def no_sync(self):
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self._sticky = True  # bug: sync stays off for one more backward

    def _on_grad(self, p):
        super()._on_grad(p)
        if self._sticky and not self._resume_queued:
            self._resume_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._resume)

    def _resume(self):
        self._sticky = self._resume_queued = False
        self.require_backward_grad_sync = True
