"""A data-parallel wrapper written from scratch on torch.distributed (control: meant to be correct).

Semantics follow torch.nn.parallel.DistributedDataParallel on CPU/gloo:
  * construction: parameters (and, with broadcast_buffers, buffers) broadcast from rank 0;
  * every forward whose predecessor was a synced grad-enabled forward re-broadcasts the buffers
    (re-read from module.named_buffers(), so rebound buffers are followed);
  * gradients: each trainable parameter's AccumulateGrad node is hooked (invisible to the user);
    at the end of the outermost backward of a synced forward, every gradient is multiplied by
    1/world_size and all-reduced (SUM).  A parameter no replica used (since the last sync) keeps
    its .grad untouched; one used elsewhere but not locally gets the reduced value.
  * no_sync(): the sync flag is read when the forward runs (as torch does).
Unsupported keywords raise TypeError (the kit then reports `unsupported`).
"""
import contextlib

import torch
import torch.distributed as dist
from torch import nn

_ACCEPTED = {"device_ids", "output_device", "dim", "broadcast_buffers", "process_group",
             "find_unused_parameters"}


class DDP(nn.Module):
    def __init__(self, module, **kwargs):
        super().__init__()
        bad = set(kwargs) - _ACCEPTED
        if bad:
            raise TypeError(f"unsupported keyword(s): {sorted(bad)}")
        if kwargs.get("device_ids") not in (None, []):
            raise TypeError("device_ids is not supported (CPU only)")
        self.module = module
        self.broadcast_buffers = kwargs.get("broadcast_buffers", True)
        self.find_unused_parameters = kwargs.get("find_unused_parameters", False)
        self.process_group = kwargs.get("process_group", None)
        self.dim = kwargs.get("dim", 0)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._world = dist.get_world_size(self.process_group)
        self._src = self._global_rank(0)
        self._params = self._collect_params()
        self._used = set()           # indices of params whose accumulator fired since last sync
        self._expect = False         # the current backward belongs to a synced forward
        self._queued = False
        self._accs = []
        self._sync_module_states()
        self._install_hooks()

    # ---------------------------------------------------------------- discovery
    def _global_rank(self, group_rank):
        if self.process_group is None:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    def _collect_params(self):
        return [p for _, p in self.module.named_parameters() if p.requires_grad]

    def _sync_params(self):
        return [p for _, p in self.module.named_parameters()]

    def _buffers_to_sync(self):
        return [b for _, b in self.module.named_buffers()]

    # ---------------------------------------------------------------- collectives
    def _broadcast(self, tensors):
        with torch.no_grad():
            for t in tensors:
                if t.numel() == 0:
                    continue
                if t.is_contiguous():
                    dist.broadcast(t, self._src, group=self.process_group)
                else:
                    tmp = t.contiguous()
                    dist.broadcast(tmp, self._src, group=self.process_group)
                    t.copy_(tmp)

    def _sync_module_states(self):
        self._broadcast(self._sync_params())
        if self.broadcast_buffers:
            self._broadcast(self._buffers_to_sync())

    # ---------------------------------------------------------------- hooks
    def _install_hooks(self):
        for i, p in enumerate(self._params):
            acc = p.view_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(i))
            self._accs.append(acc)

    def _make_hook(self, i):
        def hook(*unused):
            self._mark_ready(i)
        return hook

    def _mark_ready(self, i):
        self._used.add(i)
        if self._expect:
            self._queue_reduction()

    def _queue_reduction(self):
        if self._expect and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    # ---------------------------------------------------------------- reduction
    def _span(self, p):
        # how many elements of p's gradient go through the fused all-reduce
        return p.numel()

    def _grads_for_reduction(self):
        return list(range(len(self._params)))

    def _reduce(self):
        self._queued = False
        self._expect = False   # torch: no more hooks expected once a backward is finalized
        idx = self._grads_for_reduction()
        used = torch.zeros(len(self._params), dtype=torch.int32)
        for i in self._used:
            used[i] = 1
        dist.all_reduce(used, group=self.process_group)
        self._used = set()
        scale = 1.0 / self._world
        dense = {}
        for i in idx:
            p = self._params[i]
            g = p.grad
            if g is not None and g.is_sparse:
                continue
            dense.setdefault(p.dtype, []).append(i)
        for dtype, ids in dense.items():
            pieces = []
            for i in ids:
                p = self._params[i]
                g = p.grad
                n = self._span(p)
                if g is None:
                    pieces.append(torch.zeros(n, dtype=p.dtype))
                else:
                    pieces.append(g.reshape(-1)[:n] * scale)
            flat = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype)
            dist.all_reduce(flat, group=self.process_group)
            off = 0
            for i in ids:
                p = self._params[i]
                n = self._span(p)
                if used[i].item() > 0:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    if n == p.numel():
                        p.grad.copy_(flat[off:off + n].view(p.shape))
                    else:
                        p.grad.view(-1)[:n].copy_(flat[off:off + n])
                off += n
        for i in idx:
            p = self._params[i]
            if p.grad is not None and p.grad.is_sparse:
                g = p.grad.coalesce() * scale
                dist.all_reduce(g, group=self.process_group)
                p.grad = g

    # ---------------------------------------------------------------- forward
    def _call_module(self, inputs, kwargs):
        return self.module(*inputs, **kwargs)

    def forward(self, *inputs, **kwargs):
        sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self.require_forward_param_sync and self.broadcast_buffers:
            self._broadcast(self._buffers_to_sync())
        out = self._call_module(inputs, kwargs)
        if torch.is_grad_enabled():  # a no_grad forward leaves a pending backward's sync alone (as torch)
            self._expect = sync
        self.require_forward_param_sync = sync
        if sync:
            out = self._mark_output(out)
        return out

    def _mark_output(self, out):
        # route tensors needing grad through _EndOfBackward, keeping the structure
        found = []

        def collect(o):
            if torch.is_tensor(o):
                if o.requires_grad:
                    found.append(o)
            elif isinstance(o, (list, tuple)):
                for v in o:
                    collect(v)
            elif isinstance(o, dict):
                for v in o.values():
                    collect(v)
            elif hasattr(o, "__dataclass_fields__"):
                for k in o.__dataclass_fields__:
                    collect(getattr(o, k))
        collect(out)
        # a pre-hook on the outputs' grad_fn runs in the outermost backward that reaches them
        for t in found:
            if t.grad_fn is not None:
                t.grad_fn.register_prehook(self._prehook)
        return out

    def _prehook(self, grad_outputs):
        self._queue_reduction()
        return None

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
