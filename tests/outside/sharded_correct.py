"""A correct DDP with sharded gradient reduction (ZeRO-2 / FSDP style), on torch.distributed.

``ShardedCorrectDDP(module, **ddp_kwargs)`` is built like
``torch.nn.parallel.DistributedDataParallel`` and has its semantics (mean of the replicas'
gradients in every replica's ``.grad`` after a synced backward), but reduces the gradients the
way ZeRO stage 2 and FSDP do:

1. after a synced backward, per bucket, the gradients are flattened (fixed parameter order) and
   padded with zeros to ``W * ceil(numel / W)``;
2. ``reduce_scatter_tensor`` (sum): rank ``r`` receives shard ``r`` of the summed gradient, the
   elements ``[r * s, (r + 1) * s)`` with ``s = ceil(numel / W)`` (the last shard carries the
   padding);
3. the owner scales its shard by ``1 / divisor`` (the world size, or inside ``join()`` the
   replicas still training when ``divide_by_initial_world_size=False``);
4. ``all_gather_into_tensor`` puts the averaged shards back in rank order into one flat buffer on
   every replica, whose first ``numel`` elements are written into the ``.grad`` of every
   parameter (``gradient_as_bucket_view``: ``.grad`` becomes a view of that persistent buffer).

Every replica therefore holds the same bits. The rest mirrors DDP's documented semantics:
construction broadcasts parameters (and buffers when ``broadcast_buffers``) from rank 0;
buffers are broadcast from rank 0 before a forward that follows a synced training forward;
``no_sync()`` accumulates locally; ``find_unused_parameters`` / ``static_graph``: a parameter no
replica used keeps its gradient (``None`` stays ``None``), one used on some replicas is averaged
with zeros, and without either option a parameter unused on some replica raises
``RuntimeError``; ``join()`` shadows the collectives of a synced step with zeros (a joined owner
still scales and gathers its shard) and ends by broadcasting the last joiner's module state.

Not implemented (a missing method is reported ``unsupported`` by the kit): ``register_comm_hook``
(a DDP comm hook would replace the sharded path). Any keyword not listed in ``__init__`` (or a
non-default ``device_ids``, ``output_device``, ``dim``) raises ``TypeError``.

The faulty variants (``sharded_*.py``) override ``_sharded_mean`` (steps 1-4) only, most of them
calling ``_reduced_shard`` (steps 1-2).
"""

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

_MB = 1024 * 1024


class _Shadow(JoinHook):
    """A replica out of inputs mirrors each synced step of the others (zeros)."""

    def __init__(self, ddp, divide_by_initial_world_size):
        self.ddp = ddp
        ddp._divide_by_initial = bool(divide_by_initial_world_size)

    def main_hook(self):
        self.ddp._shadow_step()

    def post_hook(self, is_last_joiner):
        self.ddp._adopt_last_joiner(is_last_joiner)


class ShardedCorrectDDP(nn.Module, Joinable):
    """Data parallelism by reduce-scatter + all-gather of flat gradient buckets."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 init_sync=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, gradient_as_bucket_view=False, static_graph=False,
                 **unsupported):
        super().__init__()
        Joinable.__init__(self)
        if unsupported:
            raise TypeError(f"{type(self).__name__} does not implement {sorted(unsupported)}")
        if device_ids or output_device is not None or dim != 0:
            raise TypeError(f"{type(self).__name__} is CPU-only: device_ids, output_device and "
                            "dim must keep their defaults")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        self.allow_unused = bool(find_unused_parameters) or bool(static_graph)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._pos = {id(p): i for i, p in enumerate(self._params)}
        self._buckets = self._make_buckets(25.0 if bucket_cap_mb is None else bucket_cap_mb)
        self._gathered = {}  # bucket -> persistent all-gather output (gradient_as_bucket_view)
        self._used_here = set()
        self._pending = False
        self._join_work = None
        self._divide_by_initial = True
        self._shadowing = False
        if init_sync:
            with torch.no_grad():
                for t in list(module.parameters()):
                    self._bcast(t, 0)
                if self.broadcast_buffers:
                    for t in list(module.buffers()):
                        self._bcast(t, 0)
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    # ---- group helpers -----------------------------------------------------------------------
    def _bcast(self, tensor, group_rank):
        src = group_rank if self.process_group is None else dist.get_global_rank(
            self.process_group, group_rank)
        dist.broadcast(tensor, src, group=self.process_group)

    def _make_buckets(self, cap_mb):
        buckets, cur, nbytes = [], [], 0
        for i, p in enumerate(self._params):
            size = p.numel() * p.element_size()
            if cur and (nbytes + size > cap_mb * _MB or p.dtype != self._params[cur[0]].dtype):
                buckets.append(cur)
                cur, nbytes = [], 0
            cur.append(i)
            nbytes += size
        if cur:
            buckets.append(cur)
        return buckets

    # ---- public API --------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def join(self, divide_by_initial_world_size=True, enable=True,
             throw_on_early_termination=False):
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs):
        return _Shadow(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._join_work = Join.notify_join_context(self)
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers(joined=False)
        out = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = (torch.is_grad_enabled()
                                           and self.require_backward_grad_sync)
        if self.require_forward_param_sync:  # schedule the reduction on the outermost backward
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._schedule)
        return out

    def _schedule(self, grad):
        if self.require_backward_grad_sync and not self._pending:
            self._pending = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    # ---- buffers -----------------------------------------------------------------------------
    def _sync_buffers(self, joined):
        bufs = list(self.module.buffers())  # looked up afresh: forward may rebind one
        if not bufs:
            return
        src = 0
        if joined or self._join_work is not None:  # in a join: highest rank still training
            r = torch.tensor([-1 if joined else self.rank], dtype=torch.int64)
            dist.all_reduce(r, op=dist.ReduceOp.MAX, group=self.process_group)
            src = int(r.item())
        with torch.no_grad():
            for b in bufs:
                self._bcast(b, src)

    # ---- gradients ---------------------------------------------------------------------------
    def _grad_ready(self, p):
        self._used_here.add(self._pos[id(p)])
        if self.require_backward_grad_sync and not self._pending:
            self._pending = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _global_use(self, joined):
        used = torch.zeros(len(self._params))
        if not joined:
            used[list(self._used_here)] = 1.0
        dist.all_reduce(used, group=self.process_group)
        return used

    def _join_divisor(self, joined):
        """Replicas still training; only needed when not dividing by the initial world size."""
        mine = 0
        if not joined:
            mine = int(self._join_work.result()[0].item())
        n = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(n, op=dist.ReduceOp.MAX, group=self.process_group)
        return int(n.item())

    def _after_backward(self):
        self._pending = False
        divisor = self.world_size
        if self._join_work is not None:
            self._join_work.wait()
            if not self._divide_by_initial:
                divisor = self._join_divisor(joined=False)
        self._join_work = None
        used = self._global_use(joined=False)
        self._used_here = set()
        if not self.allow_unused and bool((used < 1).any()):
            raise RuntimeError(f"{type(self).__name__}: a parameter got no gradient on some "
                               "replica; pass find_unused_parameters=True")
        with torch.no_grad():
            for b, idx in enumerate(self._buckets):
                if not any(used[i] > 0 for i in idx):
                    continue  # nobody used this bucket: gradients untouched, no collective
                flat = torch.cat([self._local_grad(i).reshape(-1) for i in idx])
                mean = self._sharded_mean(b, flat, divisor)
                self._write_grads(idx, mean, used)

    def _local_grad(self, i):
        p = self._params[i]
        if p.grad is None:
            return torch.zeros_like(p)
        return p.grad.to_dense() if p.grad.is_sparse else p.grad  # Embedding(sparse=True): reduced dense

    def _shard_len(self, numel):
        return -(-numel // self.world_size)  # ceil: every element belongs to one shard

    def _gather_buffer(self, b, numel, dtype):
        if not self.gradient_as_bucket_view or self._shadowing:
            return torch.empty(numel, dtype=dtype)
        buf = self._gathered.get(b)
        if buf is None or buf.numel() != numel or buf.dtype != dtype:
            buf = self._gathered[b] = torch.empty(numel, dtype=dtype)
        return buf

    def _reduced_shard(self, flat):
        """Zero-pad ``flat`` to ``world_size`` equal shards and reduce-scatter (sum): this
        rank's shard of the summed gradient (``_shard_len(flat.numel())`` elements)."""
        n, s = flat.numel(), self._shard_len(flat.numel())
        padded = flat.new_zeros(s * self.world_size)
        padded[:n] = flat
        shard = flat.new_empty(s)
        dist.reduce_scatter_tensor(shard, padded, group=self.process_group)
        return shard

    def _sharded_mean(self, b, flat, divisor):
        """Reduce-scatter (sum), scale the owned shard, all-gather: the mean on every replica."""
        shard = self._reduced_shard(flat)
        shard.div_(divisor)
        out = self._gather_buffer(b, shard.numel() * self.world_size, flat.dtype)
        dist.all_gather_into_tensor(out, shard, group=self.process_group)
        return out[:flat.numel()]

    def _write_grads(self, idx, mean, used):
        off = 0
        for i in idx:
            p = self._params[i]
            n = p.numel()
            if used[i] > 0:
                g = mean[off:off + n].view_as(p)
                if self.gradient_as_bucket_view:
                    p.grad = g
                elif p.grad is None or p.grad.is_sparse:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            off += n

    # ---- join --------------------------------------------------------------------------------
    def _shadow_step(self):
        if self.broadcast_buffers:
            self._sync_buffers(joined=True)
        divisor = self.world_size
        if not self._divide_by_initial:
            divisor = self._join_divisor(joined=True)
        used = self._global_use(joined=True)
        self._shadowing = True  # a joined replica's own .grad (bucket views) stays untouched
        try:
            with torch.no_grad():
                for b, idx in enumerate(self._buckets):
                    if any(used[i] > 0 for i in idx):
                        zeros = torch.zeros(sum(self._params[i].numel() for i in idx),
                                            dtype=self._params[idx[0]].dtype)
                        self._sharded_mean(b, zeros, divisor)  # its shard still goes out
        finally:
            self._shadowing = False

    def _adopt_last_joiner(self, is_last_joiner):
        r = torch.tensor([self.rank if is_last_joiner else -1], dtype=torch.int64)
        dist.all_reduce(r, op=dist.ReduceOp.MAX, group=self.process_group)
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                self._bcast(t, int(r.item()))
