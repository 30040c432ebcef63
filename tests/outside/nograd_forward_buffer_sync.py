"""Fault 25.1: the buffer-sync flag is set by every forward, whatever the grad mode.

Training loop dimension: forwards without backward between optimizer steps (validation under
``torch.no_grad()`` / ``torch.inference_mode()``, the module in train or eval mode).

torch's DDP broadcasts buffers before a forward only when the previous forward was a synced
training one (``require_forward_param_sync = is_grad_enabled() and require_backward_grad_sync``).
This DDP sets the flag from ``require_backward_grad_sync`` alone, so a no-grad forward leaves it
armed: the forward after a validation forward broadcasts rank 0's buffers again (and a run of
validation forwards broadcasts before each one). When the no-grad forward ran in train mode
(BatchNorm statistics updated locally on each replica) those local updates are overwritten by
rank 0's where torch keeps them. Everything else is ``CorrectDDP``.
"""

import torch
from torch.distributed.algorithms.join import Join

from tests.outside.correct_ddp import CorrectDDP


class NoGradForwardBufferSyncDDP(CorrectDDP):
    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._join_work = Join.notify_join_context(self)
        if self.broadcast_buffers and getattr(self, "require_forward_param_sync", True):
            self._sync_buffers(joined=False)
        out = self.module(*inputs, **kwargs)
        # FAULT: grad mode ignored -- a no_grad / inference_mode forward keeps the flag armed.
        self.require_forward_param_sync = self.require_backward_grad_sync
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._arm)
        return out
