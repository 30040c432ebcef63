"""Fault 25.5: the all-reduce is waited for, and ``.grad`` written, only at ``optimizer.step()``.

Training loop dimension: gradient clipping (``clip_grad_norm_``) or any other edit of ``.grad``
between ``backward()`` and ``optimizer.step()``.

As Horovod's ``DistributedOptimizer`` does, the end of backward only *starts* the all-reduce
(``async_op=True``, on a copy of the gradients); the averaged result is written into ``p.grad``
when the work is waited for: in an optimizer step pre-hook (any optimizer holding one of the
wrapped parameters), or at the next forward. A ``clip_grad_norm_`` between backward and step
therefore clips the local, unreduced gradients, and the write-back then replaces the clipped
values by the mean of the unclipped ones: the clipping is lost (torch's DDP has the mean in
``.grad`` when backward returns, so clipping acts on it). Everything else is ``CorrectDDP``.
"""

import weakref

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tests.outside.correct_ddp import CorrectDDP


class ReduceWaitedAtStepDDP(CorrectDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._inflight = []
        self._param_ids = {id(p) for p in self._params}
        ref = weakref.ref(self)

        def pre_step(optimizer, args, kwargs):
            ddp = ref()
            if ddp is None or not ddp._inflight:
                return
            if any(id(p) in ddp._param_ids for g in optimizer.param_groups for p in g["params"]):
                ddp._finish()
        self._hook_handle = register_optimizer_step_pre_hook(pre_step)

    def _reduce_bucket(self, b, idx, divisor):
        if self._comm_hook is not None:
            return super()._reduce_bucket(b, idx, divisor)
        params = [self._params[i] for i in idx]
        flat = torch.cat([self._dense_grad(p).reshape(-1) for p in params])
        work = dist.all_reduce(flat, group=self.process_group, async_op=True)  # FAULT: not waited
        return (work, flat, divisor)

    def _write_back(self, b, idx, flat, used):
        if isinstance(flat, tuple):
            self._inflight.append((b, idx, flat, used))  # written at optimizer.step()
        else:
            super()._write_back(b, idx, flat, used)

    def _finish(self):
        pending, self._inflight = self._inflight, []
        with torch.no_grad():
            for b, idx, (work, flat, divisor), used in pending:
                work.wait()
                super()._write_back(b, idx, flat.div_(divisor), used)

    def forward(self, *inputs, **kwargs):
        if self._inflight:
            self._finish()
        return super().forward(*inputs, **kwargs)
