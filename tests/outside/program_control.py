"""A from-scratch data-parallel wrapper on torch.distributed (the correct control).

Semantics follow torch.nn.parallel.DistributedDataParallel (torch 2.13):
* construction: broadcast parameters (and buffers, with ``broadcast_buffers``) from group rank 0
  (``init_sync``);
* forward: broadcast buffers from group rank 0 when ``broadcast_buffers`` and the previous forward
  was a synced training forward (torch's ``require_forward_param_sync`` state machine);
* backward: after every parameter's gradient accumulated, one callback at the end of the backward
  multiplies each dense gradient by 1/W into a flat buffer per dtype (reverse parameter order),
  all-reduces it (SUM) and copies it back; sparse gradients are divided and all-reduced one by one;
* ``find_unused_parameters``: a used-map is all-reduced; globally unused gradients stay untouched;
* ``no_sync()``: forwards inside it produce backwards that do not reduce.
The parameter set is fixed at construction (parameters with ``requires_grad``), like torch.
"""
import contextlib

import torch
import torch.distributed as dist
from torch import nn


def _as_comm(t):
    if t.is_complex():
        return torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t


class ControlDDP(nn.Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters=False,
                 check_reduction=False, gradient_as_bucket_view=False, static_graph=False,
                 init_sync=True):
        super().__init__()
        if static_graph:
            raise TypeError("static_graph is not implemented")
        if device_ids not in (None, []) or output_device is not None:
            raise TypeError("device_ids/output_device are not implemented (CPU only)")
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()) or ())
        self._ignore = ignore
        self._params = [p for n, p in module.named_parameters() if p.requires_grad and n not in ignore]
        self._expect = False
        self._queued = False
        self._used = set()
        self._acc = []
        self._register_hooks()
        if init_sync:
            self._sync_module_states()

    # ------------------------------------------------------------------ world
    def _world_size(self):
        return dist.get_world_size(self.process_group)

    def _src(self):
        if self.process_group is None:
            return 0
        return dist.get_global_rank(self.process_group, 0)

    def _broadcast(self, tensors):
        src = self._src()
        for t in tensors:
            dist.broadcast(_as_comm(t.detach()), src=src, group=self.process_group)

    def _named_buffers(self):
        return [b for n, b in self.module.named_buffers() if n not in self._ignore]

    @torch.no_grad()
    def _sync_module_states(self):
        self._broadcast([p for n, p in self.module.named_parameters() if n not in self._ignore])
        if self.broadcast_buffers:  # torch: module states include buffers only with broadcast_buffers
            self._broadcast(self._named_buffers())

    # ------------------------------------------------------------------ hooks
    def _register_hooks(self):
        for i, p in enumerate(self._params):
            with torch.enable_grad():
                acc = p.view_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(i))
            self._acc.append(acc)

    def _make_hook(self, i):
        def hook(*_):
            self._on_grad_ready(i)
        return hook

    def _on_grad_ready(self, i):
        # used-ness accumulates over no_sync micro-steps until the next synced backward (torch's
        # local_used_map is marked before the reducer checks whether hooks are expected)
        self._used.add(i)
        if not self._expect:
            return
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _finalize(self):
        self._queued = False
        used = self._used
        self._used = set()
        with torch.no_grad():
            self._reduce(used)

    def _reduce(self, used):
        world = self._world_size()
        params = list(range(len(self._params)))[::-1]
        if self.find_unused_parameters:
            mask = torch.zeros(len(self._params), dtype=torch.int32)
            for i in used:
                mask[i] = 1
            dist.all_reduce(mask, group=self.process_group)
            params = [i for i in params if int(mask[i]) > 0]
        dense = {}
        for i in params:
            p = self._params[i]
            g = p.grad
            if g is not None and g.is_sparse:
                g.div_(world)
                dist.all_reduce(g, group=self.process_group)
                p.grad = g
                continue
            dense.setdefault(p.dtype, []).append(i)
        for dtype, idx in dense.items():
            chunks = []
            for i in idx:
                p = self._params[i]
                if p.grad is None:
                    chunks.append(torch.zeros(p.numel(), dtype=p.dtype))
                else:
                    chunks.append(p.grad.reshape(-1) * (1.0 / world))
            flat = torch.cat(chunks) if len(chunks) > 1 else chunks[0].clone()
            dist.all_reduce(flat, group=self.process_group)
            off = 0
            for i in idx:
                p = self._params[i]
                n = p.numel()
                view = flat[off:off + n].view(p.shape)
                off += n
                if p.grad is None:
                    g = torch.empty_like(p)
                    g.copy_(view)
                    p.grad = g
                else:
                    p.grad.copy_(view)

    # ---------------------------------------------------------------- forward
    def forward(self, *inputs, **kwargs):
        grad = torch.is_grad_enabled()
        if self.require_forward_param_sync and self.broadcast_buffers:
            bufs = self._named_buffers()
            if bufs:
                with torch.no_grad():
                    self._broadcast(bufs)
        if grad:
            self._expect = self.require_backward_grad_sync
        out = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = bool(grad and self.require_backward_grad_sync)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
