"""From-scratch XLA DDPs (torch_xla only, no kit code) that reduce gradients *from autograd's
threads*, as torch_xla users write them: replica 0's parameters (and, with
``broadcast_buffers``, buffers: at construction and before every training forward) taken with
``xm.collective_broadcast``; the divisor read where the reduction runs, not at construction.

* ``XlaCallbackDDP`` (correct): each parameter's post-accumulate-grad hook queues one
  end-of-backward callback (``Variable._execution_engine.queue_callback``, as torch's
  ``DistributedDataParallel`` did for its delayed all-reduce); the callback all-reduces every
  gradient with ``xm.all_reduce(REDUCE_SUM, g, scale=1 / xr.world_size())``.
* ``XlaCallbackLocalDivisorDDP``: the same callback divides by ``xr.addressable_device_count()``,
  the devices of its own host (pytorch/xla PR #4965 fixed such a divisor).
* ``XlaHookLocalDivisorDDP``: each post-accumulate-grad hook all-reduces its own gradient,
  dividing by ``xr.addressable_device_count()`` read inside the hook.

On an XLA device autograd runs those hooks and callbacks on its own device thread, not the
replica's (torch/csrc/autograd/engine.cpp), so both faults are exact on one host and 1/H of the
world on an H-host pod; the kit's W=2 PJRT world is 2 emulated hosts x 1. Run with
``--runtime pjrt``. DDP keywords they have no counterpart for raise ``TypeError`` (the kit reports
the feature unsupported), never silently ignored.
"""
import torch
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr

# Keywords that leave the arithmetic unchanged (no buckets; every parameter must be used).
IGNORED = frozenset({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph"})


def _mean_over(grad, n):
    """``grad`` (an XLA tensor, any shape) replaced in place by its sum over replicas / ``n``."""
    if grad.element_size() > (8 if grad.is_complex() else 4):
        reduced = xm.all_reduce(xm.REDUCE_SUM, grad) * (1.0 / n)  # scale= is applied in float32
    else:
        reduced = xm.all_reduce(xm.REDUCE_SUM, grad, scale=1.0 / n)
    grad.copy_(reduced)


class XlaCallbackDDP(torch.nn.Module):
    """Gradient mean over all replicas, reduced in an end-of-backward callback (correct)."""

    def __init__(self, module, broadcast_buffers=True, **kwargs):
        super().__init__()
        unknown = sorted(set(kwargs) - IGNORED)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no counterpart for {', '.join(unknown)}")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self._queued = False
        xm.collective_broadcast(list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []),
                                root_ordinal=0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad)

    def divisor(self) -> int:
        return xr.world_size()

    def _on_grad(self, p):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce_all)

    def _reduce_all(self):
        self._queued = False
        n = self.divisor()  # read here, on the thread autograd runs callbacks on
        for p in self.module.parameters():
            if p.grad is not None:
                _mean_over(p.grad, n)

    def forward(self, *args, **kwargs):
        buffers = list(self.module.buffers())
        if self.broadcast_buffers and buffers and torch.is_grad_enabled():
            xm.collective_broadcast(buffers, root_ordinal=0)
        return self.module(*args, **kwargs)


class XlaCallbackLocalDivisorDDP(XlaCallbackDDP):
    """Fault: the callback divides the sum by this host's device count."""

    def divisor(self) -> int:
        return xr.addressable_device_count()


class XlaHookLocalDivisorDDP(XlaCallbackDDP):
    """Fault: each gradient hook reduces its gradient and divides by this host's device count,
    read inside the hook."""

    def _on_grad(self, p):
        _mean_over(p.grad, xr.addressable_device_count())
