"""Four DDPs written from scratch on torch.distributed (gloo, CPU), to test the kit from outside.

Each class is built like ``torch.nn.parallel.DistributedDataParallel``: ``Class(module,
**ddp_kwargs)``. Accepted keywords: ``broadcast_buffers``, ``process_group``, ``bucket_cap_mb``,
``find_unused_parameters``, ``gradient_as_bucket_view``, and ``device_ids`` / ``output_device``
/ ``dim`` only at their CPU defaults (``None`` / ``None`` / ``0``). Any other keyword (e.g.
``static_graph``, ``mixed_precision``) raises ``TypeError``. No ``join`` and no
``register_comm_hook``.

``TransparentDDP`` -- the correct one:

* construction broadcasts every parameter from rank 0 of the group, and every buffer when
  ``broadcast_buffers`` (as torch >= 2.1 does);
* gradients: a ``register_post_accumulate_grad_hook`` per parameter marks it ready; a hook on the
  forward's output nodes queues an end-of-backward callback on the outermost backward; that
  callback all-reduces (SUM, then divides by the group's world size) bucket by bucket. Buckets:
  parameters in reverse registration order, one running bucket per dtype, closed greedily once
  its byte size reaches ``int(bucket_cap_mb * 2**20)`` (default 25); a sparse-gradient
  parameter has a bucket of its own. The reduction order is fixed, whatever the hook order;
* buffers are broadcast from rank 0 before a forward when the previous forward ran with grad
  enabled outside ``no_sync()`` (initially true) -- torch's ``require_forward_param_sync`` rule;
  the buffers are looked up afresh each time;
* ``no_sync()`` accumulates locally; the next synced backward reduces the accumulated sum;
* ``find_unused_parameters``: a parameter no replica used since the last reduction (gradients
  accumulated under ``no_sync`` count as use) keeps its gradient untouched; one used on some
  replicas is reduced with zeros from the others. Without it, a synced backward that does not
  reach every parameter makes the next forward raise ``RuntimeError`` (as torch does);
* ``gradient_as_bucket_view``: after a reduction the gradient of a contiguous dense parameter
  is a view of its bucket's flat buffer;
* ``.module`` holds the wrapped module (``state_dict`` keys carry ``module.``).

Faulty variants (exactly one fault each, otherwise identical to ``TransparentDDP``):

``ExactBucketDropDDP`` -- an off-by-one in the bucket count: when the last bucket built was closed
  by reaching the cap *exactly* (its byte size equals ``int(bucket_cap_mb * 2**20)``: the cap
  equals a parameter's size, or parameters fill it exactly), the builder has already discarded
  the empty trailing bucket but still subtracts one for it, so the last bucket (holding the
  first-registered parameters) is never reduced: its gradients stay local and the replicas drift.
  Caps below a parameter's size (a bucket larger than the cap) or above the total are unaffected.
  Modelled on boundary bugs of greedy gradient bucketing: deepspeedai/DeepSpeed#1214
  (https://github.com/deepspeedai/DeepSpeed/pull/1214, the bucket-flush check
  ``elements_in_ipg_bucket + numel > reduce_bucket_size`` misfiring at the boundary / on an empty
  bucket) and pytorch/pytorch#48880 (https://github.com/pytorch/pytorch/issues/48880, how DDP
  closes a bucket once its size reaches ``bucket_cap_mb``, the rule this builder gets wrong).

``ParamSwapDDP`` -- at wrap time it replaces every module parameter by a new ``nn.Parameter``
  holding the broadcast values (``setattr(mod, name, nn.Parameter(t.clone()))``). An optimizer
  the user built on ``model.parameters()`` BEFORE wrapping then steps tensors that no longer take
  part in the forward: the model does not train (silently). Modelled on wrappers / model surgery
  that re-create parameters after the optimizer was built: microsoft/nni#4521
  (https://github.com/microsoft/nni/issues/4521), meta-pytorch/opacus#432
  (https://github.com/meta-pytorch/opacus/issues/432), openvinotoolkit/nncf#327
  (https://github.com/openvinotoolkit/nncf/pull/327, "Do not replace parameter ... the optimizer
  received the list of model's parameters").

``RngSyncDDP`` -- at wrap time, "for reproducibility", it broadcasts rank 0's
  ``torch.get_rng_state()`` and sets it on every replica, so dropout masks that the user seeded
  per rank become identical across replicas. Modelled on huggingface/transformers#31412
  (https://github.com/huggingface/transformers/issues/31412, "Dropout sync across GPUs causes
  major performance drops") and huggingface/accelerate#114
  (https://github.com/huggingface/accelerate/issues/114, "Dropout behavior similarly across GPUs":
  the RNG state re-synchronised across processes).
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["TransparentDDP", "ExactBucketDropDDP", "ParamSwapDDP", "RngSyncDDP"]

_MiB = 1024 * 1024


def _iter_tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _iter_tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _iter_tensors(o)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _iter_tensors(getattr(obj, f.name))


def _broadcast_(t, src, group):
    """Broadcast ``t`` in place (a dense copy for strided tensors: gloo reads views as dense)."""
    if t.numel() == 0:
        return
    work = t if t.is_contiguous() else t.contiguous()
    if work.dtype == torch.bool:
        tmp = work.to(torch.uint8)
        dist.broadcast(tmp, src, group=group)
        work = tmp.to(torch.bool)
    else:
        dist.broadcast(work, src, group=group)
    if work is not t:
        t.copy_(work)


class TransparentDDP(nn.Module):
    """The correct DDP (see the module docstring)."""

    def __init__(self, module, *, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, gradient_as_bucket_view=False):
        super().__init__()
        if device_ids not in (None, []) or output_device is not None or dim != 0:
            raise TypeError("device_ids / output_device / dim are not implemented (CPU only)")
        self.module = module
        self.broadcast_buffers = bool(broadcast_buffers)
        self.process_group = process_group
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.bucket_cap_mb = 25 if bucket_cap_mb is None else bucket_cap_mb
        self._src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        self._world = dist.get_world_size(process_group)

        self._init_sync()
        self._before_wrap_hooks()

        self._sparse = {id(m.weight) for m in self.module.modules()
                        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}
        self._params = [p for p in self.module.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._buckets = self._build_buckets()
        self._bucket_bufs = [None] * len(self._buckets)
        self._require_backward_grad_sync = True
        self._require_forward_param_sync = True
        self._expect_sync = False
        self._queued = False
        self._ready = set()      # indices whose hook fired during the synced backward
        self._used = set()       # indices with a defined grad since the last reduction
        self._pending_error = None
        self._output_hooked = False
        for i, p in enumerate(self._params):
            p.register_post_accumulate_grad_hook(self._make_hook(i))

    # ------------------------------------------------------------------ construction
    def _init_sync(self):
        with torch.no_grad():
            for p in self.module.parameters():
                _broadcast_(p.data, self._src, self.process_group)
            if self.broadcast_buffers:
                for b in self.module.buffers():
                    _broadcast_(b, self._src, self.process_group)

    def _before_wrap_hooks(self):
        """Extension point for the faulty variants (nothing in the correct one)."""

    def _cap_bytes(self):
        return int(self.bucket_cap_mb * _MiB)

    def _group_buckets(self):
        """Greedy buckets: returns (buckets as lists of param indices, last_closed_exact)."""
        cap = self._cap_bytes()
        buckets, running, sizes = [], {}, {}
        last_exact = False
        for i in reversed(range(len(self._params))):
            p = self._params[i]
            if id(p) in self._sparse:
                buckets.append([i])
                last_exact = False
                continue
            key = p.dtype
            running.setdefault(key, []).append(i)
            sizes[key] = sizes.get(key, 0) + p.numel() * p.element_size()
            if sizes[key] >= cap:
                buckets.append(running.pop(key))
                last_exact = sizes.pop(key) == cap
        leftovers = [b for b in running.values() if b]
        if leftovers:
            last_exact = False
        buckets.extend(leftovers)
        return buckets, last_exact

    def _build_buckets(self):
        buckets, _ = self._group_buckets()
        return buckets

    # ------------------------------------------------------------------ API
    @contextlib.contextmanager
    def no_sync(self):
        old = self._require_backward_grad_sync
        self._require_backward_grad_sync = False
        try:
            yield
        finally:
            self._require_backward_grad_sync = old

    def _sync_buffers(self):
        bufs = list(self.module.buffers())
        if not bufs:
            return
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(bufs)):
            for b in bufs:
                _broadcast_(b, self._src, self.process_group)

    def forward(self, *args, **kwargs):
        if self._pending_error is not None:
            err, self._pending_error = self._pending_error, None
            raise RuntimeError(err)
        if self.broadcast_buffers and self._require_forward_param_sync:
            self._sync_buffers()
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self._require_backward_grad_sync:
            self._require_forward_param_sync = True
            self._prepare_backward(out)
        else:
            self._require_forward_param_sync = False
        return out

    # ------------------------------------------------------------------ backward
    def _prepare_backward(self, out):
        self._expect_sync = True
        self._queued = False
        self._ready = set()
        hooked = False
        for t in _iter_tensors(out):
            if not t.requires_grad:
                continue
            if t.grad_fn is not None:
                t.grad_fn.register_prehook(self._output_prehook)
            else:
                t.register_hook(self._output_tensor_hook)
            hooked = True
        self._output_hooked = hooked

    def _queue(self):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _output_prehook(self, grad_outputs):
        if self._expect_sync:
            self._queue()
        return None

    def _output_tensor_hook(self, grad):
        if self._expect_sync:
            self._queue()
        return None

    def _make_hook(self, i):
        def hook(p):
            if p.grad is not None:
                self._used.add(i)
            if not self._expect_sync:
                return
            self._ready.add(i)
            if not self._output_hooked:
                self._queue()
        return hook

    def _finalize(self):
        self._queued = False
        if not self._expect_sync:
            return
        self._expect_sync = False
        if not self.find_unused_parameters and len(self._ready) != len(self._params):
            missing = sorted(set(range(len(self._params))) - self._ready)
            self._pending_error = (
                "Expected to have finished reduction in the prior iteration before starting a "
                "new one: parameters %s received no gradient; pass find_unused_parameters=True"
                % missing)
            return
        self._reduce()

    def _reduced_bucket_indices(self):
        return range(len(self._buckets))

    def _reduce(self):
        globally_used = None
        if self.find_unused_parameters:
            mask = torch.zeros(len(self._params), dtype=torch.int32)
            for i in self._used:
                mask[i] = 1
            dist.all_reduce(mask, group=self.process_group)
            globally_used = mask
        with torch.no_grad():
            for b in self._reduced_bucket_indices():
                self._reduce_bucket(b, globally_used)
        self._used = set()

    def _reduce_bucket(self, b, globally_used):
        idx = self._buckets[b]
        params = [self._params[i] for i in idx]
        numels = [p.numel() for p in params]
        total = sum(numels)
        buf = self._bucket_bufs[b]
        if buf is None or buf.numel() != total:
            buf = torch.zeros(total, dtype=params[0].dtype)
            self._bucket_bufs[b] = buf
        off = 0
        for p, n in zip(params, numels):
            g = p.grad
            seg = buf[off:off + n]
            if g is None:
                seg.zero_()
            else:
                if g.is_sparse:
                    g = g.to_dense()
                if not (self.gradient_as_bucket_view and g.data_ptr() == seg.data_ptr()
                        and g.is_contiguous()):
                    seg.copy_(g.reshape(-1))
            off += n
        dist.all_reduce(buf, group=self.process_group)
        buf.div_(self._world)
        off = 0
        for i, p, n in zip(idx, params, numels):
            seg = buf[off:off + n]
            off += n
            if globally_used is not None and int(globally_used[i]) == 0:
                continue
            g = p.grad
            if g is not None and g.is_sparse:
                p.grad = seg.view(p.shape).clone().to_sparse(g.sparse_dim())
            elif self.gradient_as_bucket_view and p.is_contiguous() and id(p) not in self._sparse:
                if g is None or g.data_ptr() != seg.data_ptr():
                    p.grad = seg.view(p.shape)
            elif g is None:
                p.grad = torch.empty_like(p).copy_(seg.view(p.shape))
            else:
                g.copy_(seg.view(p.shape))


class ExactBucketDropDDP(TransparentDDP):
    """Fault: the last bucket is not reduced when it was closed exactly at the cap."""

    def _build_buckets(self):
        buckets, last_exact = self._group_buckets()
        # "the builder opened a fresh (empty) bucket after closing a full one; don't count it"
        # -- but the empty bucket was never appended: off by one, the last real bucket is lost.
        self._n_reduce = len(buckets) - 1 if last_exact else len(buckets)
        return buckets

    def _reduced_bucket_indices(self):
        return range(self._n_reduce)


class ParamSwapDDP(TransparentDDP):
    """Fault: parameters are replaced by new nn.Parameter objects at wrap time."""

    def _before_wrap_hooks(self):
        new = {}
        for mod in self.module.modules():
            for name, t in list(mod._parameters.items()):
                if t is None:
                    continue
                if id(t) not in new:
                    new[id(t)] = nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)
                setattr(mod, name, new[id(t)])


class RngSyncDDP(TransparentDDP):
    """Fault: every replica's default RNG is set to rank 0's state at wrap time."""

    def _before_wrap_hooks(self):
        state = torch.get_rng_state()
        _broadcast_(state, self._src, self.process_group)
        torch.set_rng_state(state)
