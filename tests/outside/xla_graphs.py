"""From-scratch XLA DDPs (torch_xla only, no kit code) whose arithmetic is right but whose
replicas do not build one graph, as torch_xla users write them. Run with ``--runtime pjrt``.

* ``XlaMaskBroadcastDDP`` (correct): replica 0's parameters at construction and its buffers
  before a forward that follows a grad-enabled forward (and before the first), as torch's DDP
  does (its ``require_forward_param_sync`` is set by the previous forward), by a masked all-reduce whose 0/1 mask is moved to the device
  as data (``torch.tensor(mask)`` through ``xm.send_cpu_data_to_device``, as
  ``xm.collective_broadcast`` does); gradients all-reduced with ``scale=1 / xr.world_size()`` in
  post-accumulate-grad hooks.
* ``XlaPythonMaskBroadcastDDP``: the same broadcast with the mask as a Python number,
  ``t.mul_(1.0 if xr.global_ordinal() == 0 else 0.0)``. Exact for finite values, but torch_xla
  inlines 0 and 1 as constants, so replica 0's graph multiplies by 1 and the others' by 0: on a
  pod each replica compiles its own graph (``collective_broadcast``'s comment in torch_xla:
  "We must produce the exact same graph in each replica to prevent hanging").
* ``XlaSyncInBackwardDDP``: reduces each gradient in its hook and calls ``torch_xla.sync()``
  right there, inside backward, so each replica cuts and compiles its own graph mid-backward
  (issue 26: its replicas died in a collective).

DDP keywords they have no counterpart for raise ``TypeError`` (the kit reports the feature
unsupported), never silently ignored.
"""
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

IGNORED = frozenset({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph"})


class XlaMaskBroadcastDDP(torch.nn.Module):
    """Masked-all-reduce broadcast with the mask as device data (correct)."""

    def __init__(self, module, broadcast_buffers=True, **kwargs):
        super().__init__()
        unknown = sorted(set(kwargs) - IGNORED)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no counterpart for {', '.join(unknown)}")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self._sync_next = True  # the previous forward was grad-enabled (or there was none)
        self._broadcast(list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []))
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad)

    def mask(self, t):
        keep = 1 if xr.global_ordinal() == 0 else 0
        return xm.send_cpu_data_to_device(torch.tensor(keep, dtype=t.dtype), t.device)[0]

    def _broadcast(self, tensors):
        with torch.no_grad():
            for t in tensors:
                masked = t * self.mask(t)
                t.copy_(xm.all_reduce(xm.REDUCE_SUM, masked))

    def _on_grad(self, p):
        g = p.grad
        if g.element_size() > (8 if g.is_complex() else 4):  # scale= is applied in float32
            g.copy_(xm.all_reduce(xm.REDUCE_SUM, g) * (1.0 / xr.world_size()))
        else:
            g.copy_(xm.all_reduce(xm.REDUCE_SUM, g, scale=1.0 / xr.world_size()))

    def forward(self, *args, **kwargs):
        buffers = list(self.module.buffers())
        if self.broadcast_buffers and buffers and self._sync_next:
            self._broadcast(buffers)
        self._sync_next = torch.is_grad_enabled()
        return self.module(*args, **kwargs)


class XlaPythonMaskBroadcastDDP(XlaMaskBroadcastDDP):
    """Fault: the broadcast's mask is a rank-dependent Python constant (1.0 on replica 0, else 0.0)."""

    def mask(self, t):
        return 1.0 if xr.global_ordinal() == 0 else 0.0


class XlaSyncInBackwardDDP(XlaMaskBroadcastDDP):
    """Fault: ``torch_xla.sync()`` after each gradient's all-reduce, inside backward."""

    def _on_grad(self, p):
        super()._on_grad(p)
        torch_xla.sync()
