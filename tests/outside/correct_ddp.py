"""A correct DDP written from scratch on torch.distributed, for testing the kit from outside.

``CorrectDDP(module, **ddp_kwargs)`` follows the constructor contract and the documented
semantics of ``torch.nn.parallel.DistributedDataParallel`` (torch >= 2.1, CPU/gloo):

* construction broadcasts every parameter from rank 0 of the group (``init_sync``), and every
  buffer too when ``broadcast_buffers`` (torch >= 2.1 leaves buffers alone otherwise:
  pytorch/pytorch#111138);
* after each synced backward the gradients are all-reduced and divided by the world size
  (mean over replicas), bucket by bucket in a fixed parameter order, whatever the order in which
  the autograd hooks fired;
* before each forward run with grad enabled outside ``no_sync()`` the module's buffers (looked up
  afresh, so a buffer rebound in ``forward`` is the one sent) are broadcast from rank 0;
* ``no_sync()`` accumulates gradients locally; the next synced backward reduces the sum;
* a sparse gradient (``Embedding(sparse=True)``) is reduced as a dense one and written back dense
  (torch reduces it sparse: the same mean); any dtype (one dtype per bucket) and strides (a
  gradient is copied back element for element);
* with ``find_unused_parameters`` or ``static_graph``: a parameter no replica used since the last
  reduction keeps its gradient untouched (``None`` stays ``None``); one used on some replicas only
  is reduced with zeros from the others. A gradient accumulated under ``no_sync`` counts as used.
  Without either option a parameter unused on any replica raises ``RuntimeError`` on every rank.
* ``register_comm_hook(state, hook)``: ``hook(state, bucket) -> Future[Tensor]`` replaces the
  all-reduce and the division (the hook divides, as torch's ``allreduce_hook`` does); ``bucket``
  offers ``index``, ``buffer``, ``set_buffer``, ``gradients``, ``parameters``, ``is_last``.
* ``gradient_as_bucket_view``: after a reduction every gradient is a view of its bucket's flat
  buffer;
* ``join()`` for uneven inputs (``torch.distributed.algorithms.join``): a joined replica shadows
  the others' collectives with zeros; the divisor is the initial world size or the number of
  replicas still training; afterwards the last joiner's module state is broadcast.
* the wrapper is an ``nn.Module`` holding ``.module``, so ``state_dict`` keys carry ``module.``.

Any other keyword (or a non-default ``device_ids``, ``output_device``, ``dim``) raises
``TypeError``: nothing is accepted and silently ignored. Semantics mirrored from PyTorch's DDP
documentation and design note (pytorch.org/docs/stable/notes/ddp.html); no code is shared with
the kit or with PyTorch's implementation.
"""

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

_MB = 1024 * 1024


class _Bucket:
    """Duck-typed ``torch.distributed.GradBucket`` handed to comm hooks (flat 1-D buffer)."""

    def __init__(self, index, buffer, params, is_last):
        self._index, self._buffer, self._params, self._is_last = index, buffer, params, is_last

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer

    def set_buffer(self, tensor):
        self._buffer = tensor

    def parameters(self):
        return list(self._params)

    def gradients(self):
        out, off = [], 0
        for p in self._params:
            out.append(self._buffer[off:off + p.numel()].view_as(p))
            off += p.numel()
        return out

    def is_last(self):
        return self._is_last


class _ShadowHook(JoinHook):
    """Join hook of a replica that ran out of inputs: mirrors one synced iteration's collectives."""

    def __init__(self, ddp, divide_by_initial_world_size):
        self.ddp = ddp
        ddp._divide_by_initial = divide_by_initial_world_size

    def main_hook(self):
        self.ddp._shadow_iteration()

    def post_hook(self, is_last_joiner):
        self.ddp._sync_from_last_joiner(is_last_joiner)


class CorrectDDP(nn.Module, Joinable):
    """Data-parallel wrapper: ``CorrectDDP(module, **ddp_kwargs)``; see the module docstring.

    Args mirror torch's DDP. ``bucket_cap_mb`` (float MB, default 25) sizes the flat float
    buckets. Raises ``TypeError`` for keywords it does not implement.
    """

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 init_sync=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False, **unsupported):
        super().__init__()
        Joinable.__init__(self)
        if unsupported:
            raise TypeError(f"CorrectDDP does not implement {sorted(unsupported)}")
        if device_ids or output_device is not None or dim != 0:
            raise TypeError("CorrectDDP is CPU-only: device_ids/output_device/dim must be defaults")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.static_graph = bool(static_graph)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.require_backward_grad_sync = True
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._buckets = self._assign_buckets(25 if bucket_cap_mb is None else bucket_cap_mb)
        self._flat = [None] * len(self._buckets)  # persistent buffers for gradient_as_bucket_view
        self._local_used = set()
        self._queued = False
        self._comm_hook = None
        self._join_work = None
        self._divide_by_initial = True
        if init_sync:  # buffers only with broadcast_buffers, as torch >= 2.1 (pytorch#111138)
            state = list(module.parameters())
            state += list(module.buffers()) if self.broadcast_buffers else []
            with torch.no_grad():
                for t in state:
                    self._broadcast(t, 0)
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    # ---- collectives -------------------------------------------------------------------------
    def _global(self, group_rank):
        if self.process_group is None:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    def _broadcast(self, tensor, group_rank):
        dist.broadcast(tensor, self._global(group_rank), group=self.process_group)

    def _assign_buckets(self, cap_mb):
        buckets, cur, size = [], [], 0
        for i, p in enumerate(self._params):
            nbytes = p.numel() * p.element_size()
            # one dtype per bucket (as torch): a mixed flat buffer would promote, and a bucket
            # view of it would have the wrong dtype
            if cur and (size + nbytes > cap_mb * _MB or p.dtype != self._params[cur[0]].dtype):
                buckets.append(cur)
                cur, size = [], 0
            cur.append(i)
            size += nbytes
        if cur:
            buckets.append(cur)
        return buckets

    # ---- public API --------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Inside: gradients accumulate locally, no collectives; the next synced step reduces."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def register_comm_hook(self, state, hook):
        """``hook(state, bucket) -> torch.futures.Future[Tensor]`` replaces all-reduce + divide."""
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook may be called only once")
        self._comm_hook = (state, hook)

    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        """Context manager for uneven inputs (``torch.distributed.algorithms.join.Join``)."""
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs):
        return _ShadowHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._join_work = Join.notify_join_context(self)
        # As torch's DDP: buffers are broadcast before a forward when the previous
        # forward was a synced training one (the start of an accumulation window).
        if self.broadcast_buffers and getattr(self, "require_forward_param_sync", True):
            self._sync_buffers(joined=False)
        out = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self.require_forward_param_sync:
            # Arm the end-of-backward reduction from the outputs' gradient, i.e. on the
            # outermost backward: a reentrant checkpoint runs a nested backward whose end
            # must not trigger it (a parameter may be used outside the checkpoint too).
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._arm)
        return out

    def _arm(self, grad):
        if self.require_backward_grad_sync and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    # ---- buffers ---------------------------------------------------------------------------
    def _buffer_source(self, joined):
        if self._join_work is None and not joined:
            return 0
        # In a join: the highest rank still training is authoritative.
        r = torch.tensor([-1 if joined else self.rank], dtype=torch.int64)
        dist.all_reduce(r, op=dist.ReduceOp.MAX, group=self.process_group)
        return int(r.item())

    def _sync_buffers(self, joined):
        bufs = list(self.module.buffers())  # afresh: forward may rebind a buffer
        if not bufs:
            return
        src = self._buffer_source(joined)
        with torch.no_grad():
            for b in bufs:
                self._broadcast(b, src)

    # ---- gradients -------------------------------------------------------------------------
    def _on_grad(self, p):
        self._local_used.add(self._index[id(p)])
        if self.require_backward_grad_sync and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    def _used_counts(self, joined):
        used = torch.zeros(len(self._params))
        if not joined:
            for i in self._local_used:
                used[i] = 1.0
        dist.all_reduce(used, group=self.process_group)
        return used

    def _reduce(self):
        self._queued = False
        divisor = self.world_size
        if self._join_work is not None:  # inside join(): count the replicas still training
            self._join_work.wait()
            if not self._divide_by_initial:
                divisor = int(self._join_work.result()[0].item())
            self._join_work = None
        used = self._used_counts(joined=False)
        self._local_used = set()
        if not (self.find_unused_parameters or self.static_graph) and bool((used < 1).any()):
            raise RuntimeError("CorrectDDP: a parameter got no gradient on some replica; "
                               "pass find_unused_parameters=True")
        with torch.no_grad():
            for b, idx in enumerate(self._buckets):
                if not any(used[i] > 0 for i in idx):
                    continue
                flat = self._reduce_bucket(b, idx, divisor)
                self._write_back(b, idx, flat, used)

    def _reduce_bucket(self, b, idx, divisor):
        params = [self._params[i] for i in idx]
        flat = torch.cat([self._dense_grad(p).reshape(-1) for p in params])
        if self._comm_hook is not None:
            state, hook = self._comm_hook
            out = hook(state, _Bucket(b, flat, params, b == len(self._buckets) - 1)).wait()
            return out[0] if isinstance(out, (list, tuple)) else out
        dist.all_reduce(flat, group=self.process_group)
        return flat.div_(divisor)

    @staticmethod
    def _dense_grad(p):
        """``p.grad`` as a dense tensor (zeros when ``None``): a sparse gradient
        (``Embedding(sparse=True)``) is reduced dense, the same mean torch's sparse all-reduce gives."""
        if p.grad is None:
            return torch.zeros_like(p)
        return p.grad.to_dense() if p.grad.is_sparse else p.grad

    def _write_back(self, b, idx, flat, used):
        if self.gradient_as_bucket_view:
            if self._flat[b] is None or self._flat[b].numel() != flat.numel():
                self._flat[b] = torch.empty_like(flat)
            self._flat[b].copy_(flat)
            flat = self._flat[b]
        off = 0
        for i in idx:
            p = self._params[i]
            n = p.numel()
            if used[i] > 0:
                g = flat[off:off + n].view_as(p)
                if self.gradient_as_bucket_view:
                    p.grad = g
                elif p.grad is None or p.grad.is_sparse:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            off += n

    # ---- join shadowing --------------------------------------------------------------------
    def _shadow_iteration(self):
        if self.broadcast_buffers:
            self._sync_buffers(joined=True)
        used = self._used_counts(joined=True)
        with torch.no_grad():
            for idx in self._buckets:
                if any(used[i] > 0 for i in idx):
                    zeros = torch.zeros(sum(self._params[i].numel() for i in idx),
                                        dtype=self._params[idx[0]].dtype)
                    dist.all_reduce(zeros, group=self.process_group)

    def _sync_from_last_joiner(self, is_last_joiner):
        r = torch.tensor([self.rank if is_last_joiner else -1], dtype=torch.int64)
        dist.all_reduce(r, op=dist.ReduceOp.MAX, group=self.process_group)
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                self._broadcast(t, int(r.item()))
