"""Fault 25.9: buffers broadcast once per training iteration, at the first forward after a synced
backward.

Training loop dimension: several forwards between two backwards (a GAN's discriminator run on
fake and real batches before one backward; a validation forward written without ``no_grad``).

torch's DDP broadcasts buffers before every forward that follows a synced forward with grad
enabled (``require_forward_param_sync``), whether or not a backward came between: the second of
two forwards before one backward starts from rank 0's buffers, and so does the training forward
after a grad-enabled validation forward. This DDP ties the broadcast to the backward instead
("once per iteration"), so those forwards run on each replica's own buffers. Found from outside
(a DDP written from the README and this fault kind): with a buffer feeding the output its
parameters differed from torch's DDP by 3.9e-2 after a GAN-style loop. Everything else is
``CorrectDDP``.
"""

import torch
from torch.distributed.algorithms.join import Join

from tests.outside.correct_ddp import CorrectDDP


class BufferSyncPerIterationDDP(CorrectDDP):
    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._join_work = Join.notify_join_context(self)
        # FAULT: armed by a synced backward, not by a synced forward.
        if self.broadcast_buffers and getattr(self, "_backward_synced", True):
            self._sync_buffers(joined=False)
            self._backward_synced = False
        out = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self.require_forward_param_sync:
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._arm)
        return out

    def _reduce(self):
        super()._reduce()
        self._backward_synced = True
