"""Outside probe: DDP wrappers written from scratch on torch.distributed (gloo, CPU).

One correct wrapper (``ProbeCorrectDDP``, the control) and three faulty ones, each faulty in
a way "a DDP must be transparent to what the user's own code can observe" forbids, while the
trained numbers stay right (or nearly so):

* ``ProbeDefaultDtypeLeakDDP``: reads the widest floating dtype off the module's parameters and
  makes it the process-wide default dtype at construction, never restoring it (modelled on
  ACEsuit/mace#1659 / huggingface/transformers#28461 / Lightning-AI/pytorch-lightning#18500).
* ``ProbeContiguousParamsDDP``: makes every non-contiguous parameter (channels_last, strided)
  contiguous in place at wrap time (``p.data = p.data.contiguous()``): same object, same
  values, new strides (modelled on pytorch/pytorch#79043 and #83909).
* ``ProbeExtraBufferDDP``: registers a persistent step counter buffer on the user's module, so
  ``module.state_dict()`` grows a key and a checkpoint no longer loads strictly into the
  unwrapped module (modelled on NVIDIA/physicsnemo#586).

Built like ``torch.nn.parallel.DistributedDataParallel``: ``Class(module, **ddp_kwargs)``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist
from torch.autograd import Variable

__all__ = [
    "ProbeCorrectDDP",
    "ProbeDefaultDtypeLeakDDP",
    "ProbeContiguousParamsDDP",
    "ProbeExtraBufferDDP",
]


def _tensors_in(obj, seen=None):
    """Every tensor in a (possibly nested) output, without rebuilding anything."""
    if seen is None:
        seen = set()
    if id(obj) in seen:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors_in(getattr(obj, f.name), seen)


class ProbeCorrectDDP(torch.nn.Module):
    """A plain data-parallel wrapper: the control."""

    def __init__(
        self,
        module,
        *,
        device_ids=None,
        output_device=None,
        dim=0,
        broadcast_buffers=True,
        process_group=None,
        bucket_cap_mb=None,
        find_unused_parameters=False,
        gradient_as_bucket_view=False,
    ):
        super().__init__()
        if device_ids not in (None, []) or output_device is not None or dim != 0:
            raise TypeError("only CPU defaults of device_ids/output_device/dim are supported")
        self.module = module
        self._pg = process_group
        self._world = dist.get_world_size(process_group)
        if process_group is None or process_group is dist.GroupMember.WORLD:
            self._src = 0
        else:
            self._src = dist.get_global_rank(process_group, 0)
        self._broadcast_buffers = bool(broadcast_buffers)
        self._find_unused = bool(find_unused_parameters)
        self._bucket_cap_mb = bucket_cap_mb  # performance only: accepted as a no-op
        self._grad_as_view = gradient_as_bucket_view  # performance only: accepted as a no-op

        self._before_sync(module)

        # Construction: parameters (and buffers when broadcast_buffers) from rank 0, in place.
        states = [p for p in module.parameters()]
        if self._broadcast_buffers:
            states += [b for b in module.buffers()]
        self._broadcast(states)

        self._after_sync(module)

        self._params = [p for p in module.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._used = set()
        self._queued = False
        self._require_backward_grad_sync = True
        self._require_forward_param_sync = True
        self._handles = [
            p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self._params
        ]

    # ---- fault seams (no-ops in the control) ------------------------------------------
    def _before_sync(self, module):
        pass

    def _after_sync(self, module):
        pass

    def _on_synced(self):
        pass

    # ---- collectives ----------------------------------------------------------------------
    def _broadcast(self, tensors):
        with torch.no_grad():
            for t in tensors:
                t = t.detach()
                if t.dtype == torch.bool:
                    tmp = t.to(torch.uint8)
                    dist.broadcast(tmp, self._src, group=self._pg)
                    t.copy_(tmp.to(torch.bool))
                elif t.is_contiguous():
                    dist.broadcast(t, self._src, group=self._pg)
                else:
                    tmp = t.contiguous()
                    dist.broadcast(tmp, self._src, group=self._pg)
                    t.copy_(tmp)

    def _sync_buffers(self):
        bufs = [b for b in self.module.buffers()]
        if not bufs:
            return
        with torch.autograd._unsafe_preserve_version_counter(tuple(bufs)):
            self._broadcast(bufs)

    # ---- forward ----------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        # As torch's DDP: the buffers are broadcast before a forward when the previous forward
        # was a grad-enabled, synchronising one (and before the first).
        if self._require_forward_param_sync and self._broadcast_buffers:
            self._sync_buffers()
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self._require_backward_grad_sync:
            self._require_forward_param_sync = True
            for t in _tensors_in(out):
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._on_output_grad)
        else:
            self._require_forward_param_sync = False
        return out

    # ---- backward ---------------------------------------------------------------------------
    def _on_output_grad(self, grad):
        # Runs in the outermost graph task of the backward (before any parameter's gradient),
        # so the callback runs once, at the end of the whole backward (reentrant checkpoints
        # included).
        if not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._finalize)
        return None

    def _on_grad_ready(self, param):
        self._used.add(id(param))

    def _finalize(self):
        self._queued = False
        n = len(self._params)
        if n == 0:
            return
        flags = torch.zeros(2, n, dtype=torch.int64)
        for i, p in enumerate(self._params):
            if id(p) in self._used:
                flags[0, i] = 1
            if p.grad is not None and p.grad.is_sparse:
                flags[1, i] = 1
        self._used.clear()
        dist.all_reduce(flags, group=self._pg)
        used = flags[0].tolist()
        sparse = flags[1].tolist()
        with torch.no_grad():
            for i, p in enumerate(self._params):
                if used[i] == 0:
                    continue  # unused on every replica: .grad untouched
                g = p.grad
                if sparse[i]:
                    if g is None:
                        g = torch.sparse_coo_tensor(
                            torch.zeros(p.dim(), 0, dtype=torch.int64),
                            torch.zeros((0,), dtype=p.dtype),
                            p.shape,
                        )
                    g = g.coalesce()
                    dist.all_reduce(g, group=self._pg)
                    p.grad = (g / self._world).coalesce()
                    continue
                if g is None:
                    buf = torch.zeros(p.shape, dtype=p.dtype)
                    dist.all_reduce(buf, group=self._pg)
                    buf.div_(self._world)
                    newg = torch.empty_like(p)
                    newg.copy_(buf)
                    p.grad = newg
                else:
                    buf = g.detach().clone(memory_format=torch.contiguous_format)
                    dist.all_reduce(buf, group=self._pg)
                    buf.div_(self._world)
                    g.copy_(buf)
        self._on_synced()

    @contextlib.contextmanager
    def no_sync(self):
        old = self._require_backward_grad_sync
        self._require_backward_grad_sync = False
        try:
            yield
        finally:
            self._require_backward_grad_sync = old


class ProbeDefaultDtypeLeakDDP(ProbeCorrectDDP):
    """Fault: sets the process default dtype to the module's widest floating dtype at
    construction (to build its own accumulators "at the model's precision") and never puts
    the old one back. A float32 model sees nothing; a float64 one leaves every later
    ``torch.zeros(...)`` / ``torch.tensor(1.0)`` of the user's at float64."""

    def _before_sync(self, module):
        widest = None
        for p in module.parameters():
            if p.is_floating_point() and p.dtype in (torch.float32, torch.float64):
                if widest is None or torch.finfo(p.dtype).bits > torch.finfo(widest).bits:
                    widest = p.dtype
        if widest is not None:
            torch.set_default_dtype(widest)  # not restored


class ProbeContiguousParamsDDP(ProbeCorrectDDP):
    """Fault: makes every non-contiguous parameter contiguous in place at wrap time, so the
    broadcast reads a dense tensor. The parameter object and its values are kept; its strides
    (channels_last, transposed storage) and therefore its gradient's layout change."""

    def _before_sync(self, module):
        with torch.no_grad():
            for p in module.parameters():
                if not p.is_contiguous():
                    p.data = p.data.contiguous()


class ProbeExtraBufferDDP(ProbeCorrectDDP):
    """Fault: registers a persistent step counter on the user's module (root), incremented at
    every synchronised backward. Numbers are untouched (the counter is equal on every replica);
    ``module.state_dict()`` gains ``_ddp_sync_steps``."""

    def _after_sync(self, module):
        module.register_buffer("_ddp_sync_steps", torch.zeros((), dtype=torch.int64))

    def _on_synced(self):
        buf = getattr(self.module, "_ddp_sync_steps", None)
        if isinstance(buf, torch.Tensor):
            buf.add_(1)
