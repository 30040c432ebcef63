"""Experiments that size possible speed-ups of the reference DDP (not part of ``ddp_impl``).

``ddp_impl.DistributedDataParallel`` all-reduces each gradient in its own
post-accumulate-grad hook: one blocking collective per parameter, issued in the
middle of backward. These subclasses change only *when and how* gradients are
reduced, so ``bench_throughput.py`` can measure what a change would buy before
anyone touches ``ddp_impl/ddp.py``:

* :class:`FlatRefDDP` - gradients are reduced once, at the end of backward, in
  one all-reduce per dtype (the floor's communication pattern): a flattened
  buffer on torch.distributed, a coalesced in-place list all-reduce on XLA
  (``xm.all_reduce`` of the gradient list, as ``xm.reduce_gradients``; a
  flatten/unflatten there costs more than it saves);
* :class:`BucketedAsyncRefDDP` - (torch.distributed only) gradients are packed
  into buckets in backward order and each full bucket is all-reduced with
  ``async_op=True`` while backward continues; the end of backward waits
  (torch's DDP reducer in a few lines of Python).

Both keep the reference's semantics for the cases they handle (mean over
replicas, :meth:`no_sync` accumulation, module-state and buffer broadcasts are
inherited) and defer to the reference with ``find_unused_parameters=True``.
Use them as ``--ddp benchmarks.prototypes:FlatRefDDP`` with the conformance CLI
(parity) or ``--impls`` with the benchmark (speed).
"""
from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

import ddp_impl


class FlatRefDDP(ddp_impl.DistributedDataParallel):
    """The reference DDP with one all-reduce (per dtype) at the end of backward."""

    def _on_grad_ready(self, param):
        if self.find_unused_parameters:
            return super()._on_grad_ready(param)
        if not self.require_backward_grad_sync or param.grad is None:
            return
        self._ready.add(id(param))
        if not self._finalize_queued:
            self._finalize_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce_flat)

    @torch.no_grad()
    def _reduce_flat(self):
        self._finalize_queued = False
        # Module order, not hook order: the same on every replica.
        params = [p for p in self.module.parameters() if id(p) in self._ready]
        self._ready.clear()
        groups: dict = {}
        for p in params:
            groups.setdefault((p.grad.dtype, p.grad.device), []).append(p)
        xla = type(self.collectives).__name__ == "XlaCollectives"
        for (_, _), ps in sorted(groups.items(), key=lambda kv: str(kv[0])):
            grads = [p.grad for p in ps]
            if xla:  # one coalesced all-reduce of the list, in place (as xm.reduce_gradients)
                self._xla_reduce(grads)
                continue
            flat = _flatten_dense_tensors(grads)
            self.collectives.all_reduce_(flat, scale=self._grad_scale())
            for g, red in zip(grads, _unflatten_dense_tensors(flat, grads)):
                g.copy_(red)

    def _xla_reduce(self, grads):
        import torch_xla.core.xla_model as xm
        if self.collectives.world_size == 1:
            for g in grads:
                g.mul_(self._grad_scale())
            return
        # Reduce fresh tensors and copy back: an in-place all-reduce straight on
        # a gradient that backward accumulated in place (after no_sync) is lost
        # on torch_xla 2.9 (measured: the no_sync feature check fails).
        bufs = [g.clone() for g in grads]
        xm.all_reduce(xm.REDUCE_SUM, bufs, scale=self._grad_scale(),
                      pin_layout=getattr(self.collectives, "pin_layout", True))
        for g, b in zip(grads, bufs):
            g.copy_(b)


class BucketedAsyncRefDDP(ddp_impl.DistributedDataParallel):
    """The reference DDP with torch-style buckets reduced asynchronously during backward.

    Buckets hold parameters in reverse module order (roughly the order backward
    produces gradients), up to ``bucket_cap_mb`` (default 25, the first bucket
    1 MB, as torch). A bucket is launched when all its gradients are ready and
    every earlier bucket has been launched, so every replica issues the same
    collectives in the same order. Needs torch.distributed collectives (gloo);
    elsewhere it falls back to :class:`FlatRefDDP`'s single reduction.
    """

    FIRST_BUCKET_MB = 1.0

    def __init__(self, module, *, bucket_cap_mb: float = 25.0, **kwargs):
        super().__init__(module, **kwargs)
        params = [p for p in self.module.parameters() if p.requires_grad][::-1]
        self._buckets: list[list] = []
        cap, size = self.FIRST_BUCKET_MB * 2**20, 0.0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if (not self._buckets or size + nbytes > cap
                    or self._buckets[-1][0].dtype != p.dtype):
                self._buckets.append([])
                size = 0.0
                if len(self._buckets) > 1:
                    cap = bucket_cap_mb * 2**20
            self._buckets[-1].append(p)
            size += nbytes
        self._bucket_of = {id(p): i for i, b in enumerate(self._buckets) for p in b}
        self._group = getattr(self.collectives, "group", None)
        self._async = isinstance(self.collectives, ddp_impl.TorchDistributedCollectives)
        self._reset()

    def _reset(self):
        self._pending = [len(b) for b in self._buckets]
        self._next = 0
        self._works: list = []

    def _launch_ready(self):
        import torch.distributed as dist
        while self._next < len(self._buckets) and self._pending[self._next] == 0:
            grads = [p.grad for p in self._buckets[self._next]]
            flat = _flatten_dense_tensors(grads)
            work = dist.all_reduce(flat, group=self._group, async_op=True)
            self._works.append((work, flat, grads))
            self._next += 1

    def _on_grad_ready(self, param):
        if self.find_unused_parameters:
            return super()._on_grad_ready(param)
        if not self.require_backward_grad_sync or param.grad is None:
            return
        if not self._finalize_queued:
            self._finalize_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        self._ready.add(id(param))
        if self._async:
            self._pending[self._bucket_of[id(param)]] -= 1
            self._launch_ready()

    @torch.no_grad()
    def _finish(self):
        self._finalize_queued = False
        if not self._async:
            FlatRefDDP._reduce_flat(self)
            return
        if self._next < len(self._buckets):  # some parameter got no gradient: not supported here
            self._reset()
            self._ready.clear()
            raise RuntimeError("BucketedAsyncRefDDP: a parameter received no gradient; "
                               "use find_unused_parameters=True")
        scale = self._grad_scale()
        for work, flat, grads in self._works:
            work.wait()
            flat.mul_(scale)
            for g, red in zip(grads, _unflatten_dense_tensors(flat, grads)):
                g.copy_(red)
        self._reset()
        self._ready.clear()
