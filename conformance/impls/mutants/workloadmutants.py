"""Mutants on the reference DDP (:class:`ddp_impl.DistributedDataParallel`) for the workload
corners (gradient kind, layout, dtype: fixtures/models.py; docs/scenarios.md, "The workload
axis") and the module axis (what users' modules do: docs/scenarios.md, "The module axis"): one
fault per corner. Rows of :data:`conformance.impls.mutants.catalog.MUTANTS` name them by
reference.
"""
from __future__ import annotations

import torch

from conformance.errors import Unsupported
from ddp_impl import DistributedDataParallel as RefDDP


class SparseGradUnsynced(RefDDP):
    """Sparse gradients (``Embedding(sparse=True)``) are left out of the reduction: each
    replica keeps its local sparse gradient (upstream reduces them: pytorch#19443, #22037)."""

    def __init__(self, module, **kwargs):
        if any(p.device.type == "xla" for p in module.parameters()):
            raise Unsupported("XLA has no sparse tensors (torch_xla 2.9: Embedding(sparse=True)'s backward "
                              "raises), so a sparse-gradient fault has nothing to act on")
        super().__init__(module, **kwargs)

    def _set_grad(self, param, reduced):
        if param.grad is not None and param.grad.is_sparse:
            return  # the local sparse gradient stays
        super()._set_grad(param, reduced)


class StridedUnpack(RefDDP):
    """Gradients are packed into the bucket in logical order but unpacked through a view
    with the *parameter's* strides: a channels_last or transposed parameter gets its
    gradient permuted (the gradient layout contract, pytorch#47163)."""

    def __init__(self, module, **kwargs):
        if any(p.device.type == "xla" for p in module.parameters()):
            raise Unsupported("XLA tensors carry no memory format (measured on torch_xla 2.9: a "
                              "channels_last or transposed parameter moved to the device is contiguous), "
                              "so a stride fault has nothing to permute")
        super().__init__(module, **kwargs)

    def _set_grad(self, param, reduced):
        super()._set_grad(param, reduced.as_strided(param.shape, param.stride()))


class ComplexRealBucket(RefDDP):
    """Complex gradients are copied into a real bucket: the imaginary part is lost
    (pytorch#158753)."""

    def _set_grad(self, param, reduced):
        super()._set_grad(param, reduced.real.to(reduced.dtype) if reduced.is_complex() else reduced)


class Fp32FusionBuffer(RefDDP):
    """One float32 fusion buffer for every dtype: float64 (and bfloat16) gradients are
    reduced in float32 and cast back (PiPPy#656)."""

    @torch.no_grad()
    def _reduce_bucket(self, bucket):
        if bucket.flat is None:  # reduced as a list (lazy XLA): each gradient through float32
            dtypes = [g.dtype for g in bucket.grads]
            bucket.grads = [g if g.is_complex() else g.float() for g in bucket.grads]
            super()._reduce_bucket(bucket)
            bucket.grads = [g.to(d) for g, d in zip(bucket.grads, dtypes)]
            return None
        if bucket.flat.dtype == torch.float32 or bucket.flat.is_complex():
            return super()._reduce_bucket(bucket)
        buf = self.collectives.all_reduce_(bucket.flat.float(), scale=self._grad_scale())
        bucket.flat.copy_(buf)
        return None


class OutputWalkBareTensor(RefDDP):
    """``find_unused_parameters=True`` finds the used parameters by walking the forward's
    output, but only a bare tensor: a dataclass / dict / namedtuple output yields none, so
    every parameter counts as globally unused and keeps grad ``None`` (no step)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        self._bare_output = isinstance(out, torch.Tensor)
        return out

    def _global_use_counts(self, params, used):
        counts = super()._global_use_counts(params, used)
        return counts if self.__dict__.get("_bare_output", True) else [0.0] * len(counts)


class SinkMissesStructuredOutput(RefDDP):
    """The end-of-backward sink is put on the forward's output only when it is a tensor or a plain
    tuple / list of tensors (how torch's ``_DDPSink`` once walked it, and how ``torch.utils._pytree``
    still treats a plain dataclass): a dict, namedtuple or dataclass output passes unsunk. With
    the output heads under a reentrant checkpoint, the first gradient hooks then fire inside the
    checkpoint's own backward, the end-of-backward callback is queued there and runs before the
    rest of the graph has its gradients (a missing-gradient error, or, with
    ``find_unused_parameters``, those reduced as unused)."""

    def _sink_outputs(self, out):
        if isinstance(out, torch.Tensor) or type(out) in (tuple, list):
            return super()._sink_outputs(out)
        return out


class StateDictBuffersOnly(RefDDP):
    """Broadcasts only the buffers ``state_dict()`` holds (at construction and before each
    forward): a ``persistent=False`` buffer stays per-replica."""

    def _persistent(self):
        keys = set(self.module.state_dict().keys())
        return [b for n, b in self.module.named_buffers() if n in keys]

    @torch.no_grad()
    def _sync_module_states(self):
        for t in list(self.module.parameters()) + (self._persistent() if self.broadcast_buffers else []):
            self.collectives.broadcast_(t.data, src=0)

    @torch.no_grad()
    def _sync_buffers(self):
        for b in self._persistent():
            self.collectives.broadcast_(b, src=0)


class ForwardHooksSkipped(RefDDP):
    """Runs ``module.forward(...)`` instead of ``module(...)``: the wrapped module's forward
    (pre-)hooks never run."""

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync and self._queued:
            self._reset()
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        out = self.module.forward(*args, **kwargs)  # bug: bypasses nn.Module.__call__
        self.require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        return self._sink_outputs(out) if self.require_forward_param_sync else out


class ContainerParamsUnsynced(RefDDP):
    """Parameters held by an ``nn.ParameterList`` / ``nn.ParameterDict`` are left out of the
    reduction (collected per layer, containers missed): each replica keeps its local gradient."""

    def _set_grad(self, param, reduced):
        held = {id(p) for m in self.module.modules() if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict))
                for p in m.parameters(recurse=False)}
        if id(param) not in held:  # bug: container-held gradients stay local
            super()._set_grad(param, reduced)


class ParametrizedLayerSync(RefDDP):
    """The construction broadcast walks each layer's tensors by attribute (``layer.weight``):
    a parametrized weight is computed, so the broadcast lands in a temporary and the trained
    ``...parametrizations.weight.original`` stays per-replica."""

    @torch.no_grad()
    def _sync_module_states(self):
        from torch.nn.utils import parametrize
        states = []
        for m in self.module.modules():
            if isinstance(m, parametrize.ParametrizationList):
                continue  # bug: reached through the layer's attribute instead
            states += [p for p in m._parameters.values() if p is not None]
            if parametrize.is_parametrized(m):
                states += [getattr(m, n) for n in m.parametrizations]  # computed: a temporary
        if self.broadcast_buffers:
            states += list(self.module.buffers())
        for t in states:
            self.collectives.broadcast_(t.data, src=0)


class ForwardKwargsDropped(RefDDP):
    """Calls ``module(*args)`` only: the forward's keyword arguments (``scale=``, ``mask=``, ...)
    never reach the module, which runs with its defaults (a wrapper written as ``def forward(self,
    *inputs)``)."""

    def forward(self, *args, **kwargs):
        return super().forward(*args)  # bug: kwargs dropped


class FloatBuffersOnly(RefDDP):
    """Broadcasts only floating-point buffers (at construction and before each forward): an
    integer buffer (an int64 step or sample counter) stays per-replica (a coalesced broadcast
    built in one float dtype, integer buffers filtered out)."""

    @torch.no_grad()
    def _sync_module_states(self):
        states = list(self.module.parameters())
        if self.broadcast_buffers:
            states += [b for b in self.module.buffers() if b.is_floating_point() or b.is_complex()]
        for t in states:
            self.collectives.broadcast_(t.data, src=0)

    @torch.no_grad()
    def _sync_buffers(self):
        for b in self.module.buffers():
            if b.is_floating_point() or b.is_complex():  # bug: integer buffers skipped
                self.collectives.broadcast_(b, src=0)
