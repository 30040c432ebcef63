"""Fault 25.4: gradients are reduced only when the wrapped module is in training mode.

Training loop dimension: ``backward()`` with the module in eval mode (fine-tuning with frozen
BatchNorm statistics / dropout off: ``model.eval()`` and still training).

torch's DDP reduces after every synced backward whatever ``module.training`` is. This DDP
arms its reduction only ``if self.module.training`` (as wrappers that equate eval mode with
inference do), so a backward in eval mode leaves each replica with its local gradient and the
replicas drift apart. Everything else is ``CorrectDDP``.
"""

from tests.outside.correct_ddp import CorrectDDP


class EvalModeNoReduceDDP(CorrectDDP):
    def _arm(self, grad):
        if self.module.training:  # FAULT
            super()._arm(grad)

    def _on_grad(self, p):
        self._local_used.add(self._index[id(p)])
        if self.module.training and self.require_backward_grad_sync and not self._queued:  # FAULT
            self._queued = True
            import torch
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)
