"""Mutants on the reference DDP (:class:`ddp_impl.DistributedDataParallel`) for the structural
kinds of a model (docs/topologies.md, "Structural kinds"): where a parameter or buffer sits in
the module tree, how its module holds and uses it, how the forward is called. One fault per
kind, each identical to the reference on a model without that structure. Rows of
:data:`conformance.impls.mutants.catalog.MUTANTS` name them by reference.
"""
from __future__ import annotations

import torch

from ddp_impl import DistributedDataParallel as RefDDP
from ddp_impl.ddp import DEFAULT_BUCKET_CAP_MB, MB, broadcast_many


def _own_params(module, keep) -> set:
    """Ids of the parameters registered directly on the modules of ``module`` that ``keep`` accepts."""
    return {id(p) for m in module.modules() if keep(m) for p in m._parameters.values() if p is not None}


class ParentParamsUnsynced(RefDDP):
    """Parameters registered directly on a module that also has children (a ViT's ``cls_token``,
    CLIP's ``logit_scale``, a block's gain) are left out of the reduction: the parameter walk
    goes over leaf layers only, so each replica keeps its local gradient."""

    def _set_grad(self, param, reduced):
        if id(param) not in _own_params(self.module, lambda m: any(True for _ in m.children())):
            super()._set_grad(param, reduced)


class DeepBuffersUnsynced(RefDDP):
    """Buffers more than two levels below the wrapped module (a BatchNorm inside a block of
    a block) are never broadcast: the buffer walk stops at the grandchildren."""

    def _states(self, buffers: bool):
        out = [p.data for p in self.module.parameters()]
        if buffers:
            out += [b for n, b in self.module.named_buffers() if n.count(".") <= 2]
        return out

    @torch.no_grad()
    def _sync_module_states(self):
        broadcast_many(self.collectives, self._states(self.init_sync_buffers), src=0)

    @torch.no_grad()
    def _sync_buffers(self):
        broadcast_many(self.collectives, [b for n, b in self.module.named_buffers() if n.count(".") <= 2], src=0)


class UncalledOwnerUnsynced(RefDDP):
    """A parameter is reduced only if the module owning it was called (its forward pre-hook
    fired) since the last reduction: weights a parent reads functionally
    (``F.linear(x, self.proj.weight)``, nn.MultiheadAttention's ``out_proj``) keep their local
    gradients (hook-driven engines' per-submodule gather and reduce)."""

    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._called: set = set()
        self._owner = {id(p): m for m in module.modules() for p in m._parameters.values() if p is not None}

    def forward(self, *args, **kwargs):
        called = self._called
        h = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: called.add(id(m)))
        try:
            return super().forward(*args, **kwargs)
        finally:
            h.remove()

    def _set_grad(self, param, reduced):
        if id(self._owner[id(param)]) in self._called:
            super()._set_grad(param, reduced)

    def _finalize_backward(self):
        try:
            super()._finalize_backward()
        finally:
            self._called = set()


class NoneSlotStopsWalk(RefDDP):
    """The per-module parameter walk (``module._parameters``) stops at the first ``None`` slot,
    so a module registering an optional parameter as ``None`` before real ones (MHA's
    ``q_proj_weight`` / ``bias_k``) loses the later ones from the reduction."""

    def _set_grad(self, param, reduced):
        walked = set()
        for m in self.module.modules():
            for p in m._parameters.values():
                if p is None:
                    break
                walked.add(id(p))
        if id(param) in walked:
            super()._set_grad(param, reduced)


class NonePositionalDropped(RefDDP):
    """The forward's input preparation rebuilds the positional arguments from the tensors it
    finds, dropping ``None``: ``model(x, None, extra)`` reaches the module as ``model(x, extra)``."""

    def forward(self, *args, **kwargs):
        return super().forward(*(a for a in args if a is not None), **kwargs)


class OversizeGradTruncated(RefDDP):
    """A gradient larger than the bucket cap is copied into its bucket truncated to the cap: only
    its first ``bucket_cap_mb`` MiB are averaged, the tail keeps each replica's local gradient."""

    def __init__(self, module, **kwargs):
        cap = kwargs.get("bucket_cap_mb")
        self._cap_bytes = int((DEFAULT_BUCKET_CAP_MB if cap is None else cap) * MB)
        super().__init__(module, **kwargs)

    def _set_grad(self, param, reduced):
        keep = max(1, self._cap_bytes // param.element_size())
        if param.grad is not None and not param.grad.is_sparse and param.numel() > keep:
            reduced = reduced.clone()
            reduced.reshape(-1)[keep:] = param.grad.reshape(-1)[keep:]
        super()._set_grad(param, reduced)
