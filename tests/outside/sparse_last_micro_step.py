"""Faulty DDP, written from scratch on torch.distributed: a sparse gradient is reduced from the
synced backward alone, so the micro-steps accumulated under ``no_sync()`` are lost for it.

Fault: dense gradients are reduced from ``p.grad`` (the sum over the accumulation window), but a
sparse one (``Embedding(sparse=True)`` / ``EmbeddingBag(sparse=True)``) is taken from a tensor
hook that records the gradient of the current backward only - the embedding path kept apart from
the dense buckets and not accumulated across micro-batches. Without ``no_sync`` (one backward per
step) it is exact; with an accumulation window every replica steps its embedding with the mean of
the last micro-batches only.
Modelled on: NVIDIA/recsys-examples#393 (embedding gradients handled apart from the dense ones do
not accumulate across micro-batches) and pytorch/pytorch#22037 (sparse gradients in DDP).
Exposed by: the workload corner "sparse gradient x accumulation window" (scenario.workload); the
fixed parity row parity.sparse_embedding runs one backward per step and passes it.

Semantics otherwise follow torch's DDP documentation: construction broadcasts parameters (and
buffers with ``broadcast_buffers``) from rank 0; a forward that follows a synced one starts from
rank 0's buffers; after a synced backward each gradient is the mean over replicas, in the
parameter's dtype, written back element for element (any strides); a parameter no replica used
keeps ``None``, one used by some replicas is averaged with zeros. Keywords it does not implement
raise ``TypeError``.
"""

import contextlib

import torch
import torch.distributed as dist
from torch import nn

_ACCEPTED = {"broadcast_buffers", "find_unused_parameters", "bucket_cap_mb"}  # buckets: one tensor each


class SparseLastMicroStepDDP(nn.Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0, process_group=None, **kwargs):
        super().__init__()
        given = dict(kwargs, device_ids=device_ids not in (None, []), output_device=output_device is not None,
                     dim=dim != 0, process_group=process_group is not None)
        refused = sorted(k for k, v in given.items() if k not in _ACCEPTED and v is not False)
        if refused:
            raise TypeError(f"SparseLastMicroStepDDP does not implement keyword(s) {', '.join(refused)}")
        self.module = module
        self.broadcast_buffers = kwargs.get("broadcast_buffers", True)
        self._sync = True          # outside no_sync()
        self._forward_syncs = True  # the previous forward was synced (or there was none)
        self._this_backward = {}   # id(param) -> its gradient in the current backward (sparse ones)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._sparse = {id(m.weight) for m in module.modules()
                        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}
        with torch.no_grad():
            for t in list(module.parameters()) + (list(module.buffers()) if self.broadcast_buffers else []):
                dist.broadcast(t.data, src=0)
        for p in self._params:
            if id(p) in self._sparse:
                p.register_hook(self._recorder(p))

    def _recorder(self, p):
        def record(grad):  # the gradient flowing into p in this backward (not the accumulated one)
            prev = self._this_backward.get(id(p))
            self._this_backward[id(p)] = grad if prev is None else prev + grad
        return record

    @contextlib.contextmanager
    def no_sync(self):
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def forward(self, *args, **kwargs):
        if self._forward_syncs and self.broadcast_buffers:
            with torch.no_grad():
                for b in self.module.buffers():  # looked up afresh: a rebound buffer is the one sent
                    dist.broadcast(b, src=0)
        self._this_backward = {}
        out = self.module(*args, **kwargs)
        synced = torch.is_grad_enabled() and self._sync
        self._forward_syncs = synced
        if synced and torch.is_tensor(out) and out.requires_grad:
            out.register_hook(self._queue_reduction)
        return out

    def _queue_reduction(self, grad):
        torch.autograd.Variable._execution_engine.queue_callback(self._reduce)
        return grad

    @torch.no_grad()
    def _reduce(self):
        world = dist.get_world_size()
        used = torch.tensor([float(p.grad is not None) for p in self._params])
        dist.all_reduce(used)
        for p, n in zip(self._params, used.tolist()):
            if n == 0:
                continue  # no replica used it: stays None
            g = self._this_backward.get(id(p)) if id(p) in self._sparse else p.grad  # the fault
            g = torch.zeros_like(p) if g is None else (g.to_dense() if g.is_sparse else g)
            flat = g.contiguous().clone()
            dist.all_reduce(flat)
            flat /= world
            if p.grad is None or p.grad.is_sparse:
                p.grad = torch.empty_like(p)
            p.grad.copy_(flat)
