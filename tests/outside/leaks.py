"""DDPs that leave process-wide state changed, written from scratch as users write them, and their
correct control. Each one averages gradients correctly; what it gets wrong is what it leaves
behind in the replica's process, which the next implementation in the same world would read.

``Control(module, **ddp_kwargs)``: parameters (and, with ``broadcast_buffers``, buffers) from
replica 0 at construction, buffers again before every grad-enabled forward, each gradient
averaged by a post-accumulate-grad hook - with torch.distributed (gloo) on CPU tensors and with
torch_xla's ``xm`` collectives on XLA tensors. Keywords it has no counterpart for raise
``TypeError`` (the kit reports the feature unsupported). The leaking classes, one per kind of
state (each modelled on a public report):

* ``InitsProcessGroup``: initialises torch.distributed where it is not (the rank bindings'
  ``init_pjrt_process_group`` on PJRT, as pytorch/xla's DDP guide asks of a script), never
  destroyed (huggingface/accelerate#2318: a library initialising the group as a side effect);
* ``SetsLauncherEnv``: writes ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` into
  ``os.environ`` for a rendezvous (Lightning-AI/pytorch-lightning#14916);
* ``WrapsAllReduce``: replaces ``torch.distributed.all_reduce`` (and ``xm.all_reduce``) with a
  counting wrapper for profiling, never put back (pytorch/pytorch#82299, monkeypatched collectives);
* ``PatchesLinear``: replaces ``torch.nn.functional.linear`` with a wrapper that upcasts inputs,
  never put back (microsoft/DeepSpeed#2733, patched functional ops);
* ``GlobalForwardHook``: counts forwards with ``register_module_forward_hook``, a hook on every
  module of the process, never removed (pytorch/pytorch#78643);
* ``LeavesAutocast``: switches autocast on for its forward and never off (pytorch/pytorch#100245:
  autocast state leaked past the region meant to use it);
* ``RegistersBackend``: registers a torch.distributed backend of its own name at construction
  (pytorch/pytorch#115331: duplicate ``register_backend`` across libraries).
"""
import os

import torch
import torch.distributed as dist

# Keywords that leave this DDP's arithmetic unchanged (no buckets, every parameter used).
IGNORED = frozenset({"bucket_cap_mb", "gradient_as_bucket_view"})


def _on_xla(t) -> bool:
    return t.device.type == "xla"


class Control(torch.nn.Module):
    """Correct: the gradient mean over every replica; leaves nothing behind."""

    def __init__(self, module, broadcast_buffers=True, **kwargs):
        super().__init__()
        unknown = sorted(set(kwargs) - IGNORED)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no counterpart for {', '.join(unknown)}")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.xla = any(_on_xla(p) for p in module.parameters())
        self.leak()
        self._broadcast(list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []))
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._average)

    def leak(self) -> None:
        """What the leaking subclasses leave behind (nothing here)."""

    def _broadcast(self, tensors) -> None:
        if self.xla:
            import torch_xla.core.xla_model as xm
            xm.collective_broadcast(tensors, root_ordinal=0)
            return
        for t in tensors:
            dist.broadcast(t.data, src=0)

    def _average(self, p) -> None:
        g = p.grad
        if self.xla:
            import torch_xla.core.xla_model as xm
            import torch_xla.runtime as xr
            g.copy_(xm.all_reduce(xm.REDUCE_SUM, g) / xr.world_size())
            return
        dist.all_reduce(g)
        g.div_(dist.get_world_size())

    def forward(self, *args, **kwargs):
        buffers = list(self.module.buffers())
        if self.broadcast_buffers and buffers and torch.is_grad_enabled():
            self._broadcast(buffers)
        return self.module(*args, **kwargs)


class InitsProcessGroup(Control):
    def leak(self):
        if self.xla:
            from ddp_impl.runtime.xla import init_pjrt_process_group
            init_pjrt_process_group()
        elif not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


class SetsLauncherEnv(Control):
    def leak(self):
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"


class WrapsAllReduce(Control):
    calls = 0

    def leak(self):
        def counted(original):
            def wrapper(*args, **kwargs):
                WrapsAllReduce.calls += 1
                return original(*args, **kwargs)
            return wrapper
        if not getattr(dist.all_reduce, "_counted", False):
            dist.all_reduce = counted(dist.all_reduce)
            dist.all_reduce._counted = True
        if self.xla:
            import torch_xla.core.xla_model as xm
            if not getattr(xm.all_reduce, "_counted", False):
                xm.all_reduce = counted(xm.all_reduce)
                xm.all_reduce._counted = True


class PatchesLinear(Control):
    def leak(self):
        import torch.nn.functional as F
        if getattr(F.linear, "_patched", False):
            return
        original = F.linear

        def linear(x, weight, bias=None):
            return original(x.to(weight.dtype), weight, bias)
        linear._patched = True
        F.linear = linear


class GlobalForwardHook(Control):
    forwards = 0

    def leak(self):
        def count(module, args, output):
            GlobalForwardHook.forwards += 1
        torch.nn.modules.module.register_module_forward_hook(count)


class LeavesAutocast(Control):
    def forward(self, *args, **kwargs):
        # bfloat16 autocast for the module's forward, switched on and never off again
        torch.set_autocast_enabled("xla" if self.xla else "cpu", True)
        return super().forward(*args, **kwargs)


class RegistersBackend(Control):
    def leak(self):
        name = "counting_gloo"
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, lambda *a, **k: None, devices=["cpu"])
