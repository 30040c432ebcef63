"""Fault 25.8: the wrapper calls ``self.module.forward(...)`` instead of ``self.module(...)``.

Module dimension: forward pre-hooks / forward hooks registered on the wrapped module itself
(``register_forward_pre_hook``: input normalisation, weight-norm style reparametrisation,
``torch.nn.utils.prune``-like masks, adapters), as opposed to hooks on its submodules.

Calling ``forward`` directly skips ``nn.Module.__call__``, so the wrapped module's own forward
pre-hooks and forward hooks never run (submodules' hooks still run: they are called through
``__call__`` inside ``forward``). torch's DDP calls ``self.module(*inputs, **kwargs)``.
Everything else is ``CorrectDDP``.
"""

import torch
from torch.distributed.algorithms.join import Join

from tests.outside.correct_ddp import CorrectDDP


class ForwardBypassesHooksDDP(CorrectDDP):
    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._join_work = Join.notify_join_context(self)
        if self.broadcast_buffers and getattr(self, "require_forward_param_sync", True):
            self._sync_buffers(joined=False)
        out = self.module.forward(*inputs, **kwargs)  # FAULT: the module's own hooks skipped
        self.require_forward_param_sync = (torch.is_grad_enabled()
                                           and self.require_backward_grad_sync)
        if self.require_forward_param_sync:
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._arm)
        return out
