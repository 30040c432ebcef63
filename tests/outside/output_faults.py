"""Outside DDPs whose faults live in how a wrapper finds the autograd graph and the end of the
backward from what the module returns (written from scratch on torch.distributed by someone who
had read only the README; kept as regression inputs): a correct control and three faults, each
modelled on a public report cited in its class. Each behaves like torch's DDP for a module
returning a plain tensor in a plain loop.
"""
import collections
import contextlib
import dataclasses

import torch
import torch.distributed as dist


class _Flags:
    exact_type_dispatch = False   # FAULT A: container lookup by exact class
    first_tensor_anchor = False   # FAULT B: only the first output tensor is hooked
    graph_reached_only = False    # FAULT C: reduce only params reachable in the output graph


_ALLOWED_NONE = ("device_ids", "output_device")


class BaseDDP(torch.nn.Module):
    flags = _Flags

    def __init__(self, module, broadcast_buffers=None, process_group=None, init_sync=True,
                 forward_sync_buffers=None, find_unused_parameters=False, **unsupported):
        super().__init__()
        for k in _ALLOWED_NONE:
            if k in unsupported and unsupported[k] is None:
                unsupported.pop(k)
        if unsupported:
            raise TypeError(f"{type(self).__name__} does not implement {sorted(unsupported)}")
        # find_unused_parameters: accepted; the reduction already leaves globally unused
        # parameters' grads untouched and averages locally unused ones with zeros.
        self.find_unused_parameters = find_unused_parameters
        if forward_sync_buffers is not None:
            self.broadcast_buffers, init_sync_buffers = forward_sync_buffers, True
        else:
            eff = True if broadcast_buffers is None else broadcast_buffers
            self.broadcast_buffers, init_sync_buffers = eff, eff
        self.module = module
        self.process_group = process_group
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._armed = False
        self._queued = False
        self._handles = []
        self._reached = set()
        if init_sync:
            # like torch DDP: broadcast_buffers=False also leaves buffers out of the init sync
            states = list(module.parameters()) + (list(module.buffers()) if init_sync_buffers else [])
            with torch.no_grad():
                for t in states:
                    dist.broadcast(t.data, src=self._global_src(), group=process_group)

    # ---------------------------------------------------------------- helpers
    def _global_src(self):
        if self.process_group is None:
            return 0
        return dist.get_global_rank(self.process_group, 0)

    def _world(self):
        return dist.get_world_size(self.process_group)

    def _params(self):
        return [p for p in self.module.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def _sync_buffers(self):
        bufs = list(self.module.buffers())
        if not bufs:
            return
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(bufs)):
            for b in bufs:
                dist.broadcast(b, src=self._global_src(), group=self.process_group)

    # ------------------------------------------------------ finding tensors
    def _find_tensors(self, obj):
        if isinstance(obj, torch.Tensor):
            return [obj]
        if self.flags.exact_type_dispatch:
            # FAULT A: like torch.utils._pytree's lookup by exact class, a subclass
            # of a registered container (HF ModelOutput subclasses OrderedDict) is a leaf.
            t = type(obj)
            if t in (list, tuple) or (t.__bases__ == (tuple,) and hasattr(t, "_fields")):
                return [x for o in obj for x in self._find_tensors(o)]
            if t in (dict, collections.OrderedDict, collections.defaultdict):
                return [x for o in obj.values() for x in self._find_tensors(o)]
            if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and not isinstance(obj, dict):
                return [x for f in dataclasses.fields(obj) for x in self._find_tensors(getattr(obj, f.name))]
            return []
        if isinstance(obj, (list, tuple)):
            return [x for o in obj for x in self._find_tensors(o)]
        if isinstance(obj, dict):
            return [x for o in obj.values() for x in self._find_tensors(o)]
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return [x for f in dataclasses.fields(obj) for x in self._find_tensors(getattr(obj, f.name))]
        return []

    def _graph_params(self, tensors):
        """FAULT C helper: leaves (AccumulateGrad variables) reachable from the outputs."""
        seen, found, stack = set(), set(), [t.grad_fn for t in tensors if t.grad_fn is not None]
        for t in tensors:
            if t.grad_fn is None and t.requires_grad:
                found.add(id(t))
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            var = getattr(fn, "variable", None)
            if var is not None:
                found.add(id(var))
            for nxt, _ in fn.next_functions:
                if nxt is not None:
                    stack.append(nxt)
        return found

    # ---------------------------------------------------------------- forward
    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            self._arm(out)
        else:
            self.require_forward_param_sync = False
            if torch.is_grad_enabled() and self.flags.graph_reached_only:
                # no_sync micro-steps count too: their gradients are reduced at the next sync
                self._reached |= self._graph_params(
                    [t for t in self._find_tensors(out) if t.requires_grad])
        return out

    def _arm(self, out):
        tensors = self._find_tensors(out)
        if self.flags.first_tensor_anchor:
            # FAULT B: the first tensor of the output is taken as the one the loss
            # comes from; if it needs no grad or is left out of the loss, nothing fires.
            tensors = [t for t in tensors[:1] if t.requires_grad]
        else:
            tensors = [t for t in tensors if t.requires_grad]
        self._armed = True
        if self.flags.graph_reached_only:
            self._reached |= self._graph_params(tensors)
        seen = set()
        for t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            self._handles.append(t.register_hook(self._on_output_grad))

    def _on_output_grad(self, grad):
        if self._armed and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce)
        return None

    # ------------------------------------------------------------- reduction
    def _reduce(self):
        self._queued = False
        if not self._armed:
            return
        self._armed = False
        for h in self._handles:
            h.remove()
        self._handles = []
        params = self._params()
        if self.flags.graph_reached_only:
            # FAULT C: parameters the output's graph does not show (hidden behind a
            # reentrant checkpoint) are treated as unused and left unreduced.
            # (the reached sets are united over the ranks, so ranks agree on the list)
            reached = self._reached
            self._reached = set()
            mask = torch.tensor([1.0 if id(p) in reached else 0.0 for p in params])
            dist.all_reduce(mask, group=self.process_group)
            params = [p for p, m in zip(params, mask.tolist()) if m > 0]
        if not params:
            return
        world = self._world()
        with torch.no_grad():
            used = torch.tensor([0.0 if p.grad is None else 1.0 for p in params])
            dist.all_reduce(used, group=self.process_group)
            live = [p for p, u in zip(params, used.tolist()) if u > 0]
            if not live:
                return
            by_dtype = {}
            for p in live:
                if p.grad is not None and p.grad.is_sparse:
                    g = p.grad.coalesce() / world  # sparse grads: reduced as sparse tensors
                    dist.all_reduce(g, group=self.process_group)
                    p.grad = g
                    continue
                by_dtype.setdefault(p.dtype, []).append(p)
            for group in by_dtype.values():
                flat = torch.cat([
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in group
                ])
                flat.div_(world)
                dist.all_reduce(flat, group=self.process_group)
                off = 0
                for p in group:
                    n = p.numel()
                    g = flat[off:off + n].view_as(p)
                    off += n
                    if p.grad is None:
                        p.grad = g.clone()
                    else:
                        p.grad.copy_(g)


class ControlDDP(BaseDDP):
    """Control: the same code with every fault switched off."""
    flags = type("ControlFlags", (_Flags,), {})


class ModelOutputDDP(BaseDDP):
    """FAULT A: output containers are looked up by exact class (tuple, list, namedtuple,
    dict, OrderedDict, defaultdict, dataclass), as torch.utils._pytree does. A subclass of
    OrderedDict such as a HuggingFace ``ModelOutput`` is a leaf: none of its tensors get
    the end-of-backward hook, so no gradient is averaged and the replicas drift apart.

    Public report: https://github.com/huggingface/transformers/issues/25357
    ("DDP grads not synced when static_graph=True": ModelOutput is an OrderedDict
    subclass but pytree looks the node type up by exact class, so its tensors were
    not found and gradients not synchronized; see also pytorch/pytorch#106690).
    """
    flags = type("ModelOutputFlags", (_Flags,), {"exact_type_dispatch": True})


class FirstOutputAnchorDDP(BaseDDP):
    """FAULT B: only the FIRST tensor found in the output is hooked to detect the
    end of the backward. When that output is not part of the loss (several outputs,
    loss built from another one) or needs no grad (a mask / argmax / detached tensor
    returned first), the hook never fires and gradients are not averaged.

    Public report: https://github.com/pytorch/pytorch/issues/97030
    ("DDP static graph fails for static model": forward returns (a, b), loss uses only
    a, DDP's output-based bookkeeping breaks). Related: pytorch/pytorch#79171 and
    pytorch/pytorch#60882 (outputs with no grad_fn broke DDP's output sink).
    """
    flags = type("FirstAnchorFlags", (_Flags,), {"first_tensor_anchor": True})


class CheckpointBlindDDP(BaseDDP):
    """FAULT C: the set of parameters to reduce is taken from a walk of the autograd
    graph from the output tensors (AccumulateGrad leaves reached), like
    find_unused_parameters. Parameters inside a reentrant activation checkpoint
    (torch.utils.checkpoint(..., use_reentrant=True)) are not in that graph, so they
    are treated as unused and their gradients are left local (unaveraged).

    Public report: https://github.com/pytorch/pytorch/issues/24005
    ("checkpoint_sequential ... breaks when used in combination with
    DistributedDataParallel": graph traversal from outputs does not see parameters
    behind a reentrant checkpoint). Also huggingface/accelerate#2017.
    """
    flags = type("CheckpointBlindFlags", (_Flags,), {"graph_reached_only": True})
