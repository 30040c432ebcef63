"""Faulty DDP (l): gradients paired across replicas by hook arrival order.

Fault: every replica packs its gradients into one flat buffer in the order their autograd hooks
fired and all-reduces that buffer; when control flow differs between replicas (rank-dependent
branch order), slot k holds different parameters on different replicas and unrelated gradients
are averaged together. With the same order on every replica it is exact.
Modelled on: deepspeedai/DeepSpeed#1186 (bucket order must be identical across processes;
"gradient order is different across processes only if the forward graph is different") and
pytorch/pytorch#72843 (mismatched collectives from rank-dependent forwards)
https://github.com/deepspeedai/DeepSpeed/issues/1186 .
Exposed by: a model with rank-dependent control flow (param parity).
"""

import torch
import torch.distributed as dist

from .correct_ddp import CorrectDDP


class HookOrderPairingDDP(CorrectDDP):
    def _on_grad(self, p):
        order = self.__dict__.setdefault("_arrival", [])
        if self.require_backward_grad_sync and self._index[id(p)] not in order:
            order.append(self._index[id(p)])
        super()._on_grad(p)

    def _reduce(self):
        order = self.__dict__.pop("_arrival", [])
        used = self._used_counts(joined=False)
        self._queued, self._local_used, self._join_work = False, set(), None
        # unused parameters (not in the arrival order) go last, in parameter order
        order += [i for i in range(len(self._params)) if i not in order and used[i] > 0]
        params = [self._params[i] for i in order]
        with torch.no_grad():
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                              for p in params])
            dist.all_reduce(flat, group=self.process_group)
            flat.div_(self.world_size)
            off = 0
            for p in params:
                g = flat[off:off + p.numel()].view_as(p)
                p.grad = g.clone()
                off += p.numel()
