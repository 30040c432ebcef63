"""Fault 25.5b: the reduced gradients are committed to ``.grad`` again at ``optimizer.step()``.

Training loop dimension: gradient clipping (``clip_grad_norm_``) or any other edit of ``.grad``
between ``backward()`` and ``optimizer.step()``.

Unlike 25.5 (``reduce_waited_at_step``), ``.grad`` holds the right mean when backward returns:
the reduction is exactly ``CorrectDDP``'s. But the DDP keeps each reduced bucket as its
"master" gradient and, in an optimizer step pre-hook (any optimizer holding one of the wrapped
parameters), copies it into ``.grad`` once more before the update -- as master-gradient
wrappers (fp16 optimizers with fp32 master grads) do, where clipping the model's ``.grad``
does not reach the gradients the optimizer applies. A ``clip_grad_norm_`` between backward
and step is thereby undone; a loop without edits of ``.grad`` sees no difference.
"""

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tests.outside.correct_ddp import CorrectDDP


class StepRecommitsGradsDDP(CorrectDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._master = []
        self._param_ids = {id(p) for p in self._params}
        ref = weakref.ref(self)

        def pre_step(optimizer, args, kwargs):
            ddp = ref()
            if ddp is None or not ddp._master:
                return
            if any(id(p) in ddp._param_ids for g in optimizer.param_groups for p in g["params"]):
                ddp._recommit()
        self._hook_handle = register_optimizer_step_pre_hook(pre_step)

    def _write_back(self, b, idx, flat, used):
        super()._write_back(b, idx, flat, used)
        self._master.append((idx, flat.detach().clone(), used))

    def _recommit(self):
        master, self._master = self._master, []
        with torch.no_grad():
            for idx, flat, used in master:
                off = 0
                for i in idx:
                    p = self._params[i]
                    n = p.numel()
                    if used[i] > 0 and p.grad is not None and not p.grad.is_sparse:
                        p.grad.copy_(flat[off:off + n].view_as(p))  # FAULT: undoes clipping
                    off += n

    def forward(self, *inputs, **kwargs):
        self._master = []  # a new iteration: the previous master gradients are stale
        return super().forward(*inputs, **kwargs)
