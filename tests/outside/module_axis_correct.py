"""A second correct DDP written from scratch on torch.distributed (issue 25 item 6, the control
of the module-axis faults ``module_axis_*.py``). Written from the README and torch's DDP
documentation only; it shares no code with the kit, with ``correct_ddp.py`` or with PyTorch's
implementation.

``Class(module, **ddp_kwargs)``, CPU / gloo, semantics of ``torch.nn.parallel.DistributedDataParallel``:

* construction (``init_sync``): every parameter and, with ``broadcast_buffers``, every buffer is
  broadcast from rank 0 of the group;
* before a forward that follows a synced training forward (grad enabled, outside ``no_sync``),
  with ``broadcast_buffers``: every buffer of the module (looked up afresh) is broadcast from
  rank 0;
* the forward calls ``self.module(*args, **kwargs)`` (hooks and keyword arguments kept);
* after a synced backward (queued at the end of the outermost backward, armed by the gradient
  of an output tensor or by the first parameter gradient): every gradient is all-reduced and
  divided by the world size, one flat tensor per dtype in a fixed parameter order (sparse
  gradients reduced dense);
* ``find_unused_parameters=True``: the parameters a forward used are found by walking the
  autograd graph from its output tensors (found in tensors, tuples/lists incl. namedtuples,
  mappings and dataclasses); a parameter no replica used since the last reduction keeps its
  gradient; one used on some replicas is reduced with zeros from the others. Without it, a
  parameter no replica used raises ``RuntimeError``;
* ``no_sync()``: gradients accumulate locally; the next synced backward reduces the sum.

Not implemented (``TypeError``, so the cases needing them are unsupported): ``bucket_cap_mb``,
``gradient_as_bucket_view``, ``static_graph=True``, ``check_reduction=True``, device_ids /
output_device / dim other than the defaults, any other keyword; no ``join`` or
``register_comm_hook``.

The faulty variants override one of the small methods marked ``(overridable)``.
"""

import contextlib
import dataclasses
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn


def find_output_tensors(obj):
    """Every tensor in a forward's output: tensor, tuple/list (namedtuples too), mapping,
    dataclass instance."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in find_output_tensors(getattr(obj, f.name))]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in find_output_tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in find_output_tensors(v)]
    return []


def graph_params(tensors):
    """ids of the leaf tensors (parameters) reachable backwards from ``tensors``' autograd graph."""
    found, seen = set(), set()
    stack = []
    for t in tensors:
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:  # a leaf returned as is
            found.add(id(t))
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # AccumulateGrad node
        if var is not None:
            found.add(id(var))
        for nxt, _ in fn.next_functions:
            if nxt is not None and nxt not in seen:
                stack.append(nxt)
    return found


class Class(nn.Module):
    """``Class(module, **ddp_kwargs)``: see the module docstring."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 init_sync=True, process_group=None, find_unused_parameters=False,
                 check_reduction=False, static_graph=False, **unsupported):
        super().__init__()
        if unsupported:
            raise TypeError(f"{type(self).__name__} does not implement {sorted(unsupported)}")
        if device_ids or output_device is not None or dim != 0:
            raise TypeError("CPU only: device_ids / output_device / dim must be the defaults")
        if static_graph or check_reduction:
            raise TypeError("static_graph / check_reduction not implemented")
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._params = self._grad_params()
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._hooked = set()      # parameters whose gradient arrived since the last reduction
        self._window_used = set()  # find_unused: parameters used by no_sync forwards
        self._forward_used = set()  # find_unused: parameters used by the last synced forward
        self._queued = False
        if init_sync:
            self._initial_broadcast()
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    # ---- (overridable) pieces ----------------------------------------------------------------
    def _grad_params(self):
        """The parameters whose gradients are reduced, in a fixed order."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def _initial_broadcast(self):
        state = list(self.module.parameters())
        if self.broadcast_buffers:
            state += list(self.module.buffers())
        with torch.no_grad():
            for t in state:
                self._broadcast(t)

    def _synced_buffers(self):
        return list(self.module.buffers())

    def _call_module(self, inputs, kwargs):
        return self.module(*inputs, **kwargs)

    def _output_tensors(self, out):
        return find_output_tensors(out)

    # ---- collectives -------------------------------------------------------------------------
    def _broadcast(self, tensor):
        src = 0 if self.process_group is None else dist.get_global_rank(self.process_group, 0)
        dist.broadcast(tensor, src, group=self.process_group)

    # ---- public API --------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self.require_forward_param_sync:
            with torch.no_grad():
                for b in self._synced_buffers():
                    self._broadcast(b)
        out = self._call_module(inputs, kwargs)
        training = torch.is_grad_enabled()
        self.require_forward_param_sync = training and self.require_backward_grad_sync
        if training:
            tensors = [t for t in self._output_tensors(out) if t.requires_grad]
            if self.find_unused_parameters:
                used = graph_params(tensors)
                if self.require_backward_grad_sync:
                    self._forward_used = used
                else:
                    self._window_used |= used
            if self.require_backward_grad_sync:
                for t in tensors:
                    t.register_hook(self._arm)
        return out

    # ---- gradients -------------------------------------------------------------------------
    def _arm(self, grad):
        if self.require_backward_grad_sync and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    def _on_grad(self, p):
        self._hooked.add(id(p))
        self._arm(None)

    def _reduce(self):
        self._queued = False
        if self.find_unused_parameters:
            local = self._forward_used | self._window_used
        else:
            local = self._hooked
        self._hooked, self._window_used, self._forward_used = set(), set(), set()
        used = torch.tensor([1.0 if id(p) in local else 0.0 for p in self._params])
        dist.all_reduce(used, group=self.process_group)
        if not self.find_unused_parameters and bool((used < 1).any()):
            raise RuntimeError("a parameter got no gradient on any replica; "
                               "pass find_unused_parameters=True")
        live = [p for p, u in zip(self._params, used.tolist()) if u > 0]
        by_dtype = {}
        for p in live:
            by_dtype.setdefault(p.dtype, []).append(p)
        with torch.no_grad():
            for params in by_dtype.values():
                flat = torch.cat([self._dense(p).reshape(-1) for p in params])
                dist.all_reduce(flat, group=self.process_group)
                flat.div_(self.world_size)
                off = 0
                for p in params:
                    g = flat[off:off + p.numel()].view(p.shape)
                    off += p.numel()
                    if p.grad is None or p.grad.is_sparse:
                        p.grad = g.clone()
                    else:
                        p.grad.copy_(g)

    @staticmethod
    def _dense(p):
        if p.grad is None:
            return torch.zeros(p.shape, dtype=p.dtype)
        return p.grad.to_dense() if p.grad.is_sparse else p.grad
