"""Faulty DDPs written from scratch, as a new user would, for measuring the kit through its CLI.

``ScratchDDP(module, **ddp_kwargs)`` all-reduces and averages each gradient in a
post-accumulate-grad hook as backward produces it: ``torch.distributed`` on CPU (parameters
broadcast from rank 0 at wrap), ``xm.all_reduce`` on an XLA device (``xm.collective_broadcast``
at wrap; the kit's step sync runs the collectives). Keywords it does not implement raise
``TypeError``. Each subclass injects one fault on replica 1 at step 2 (1-based), first hook:

* ``HangInBackward`` sleeps (``SECONDS``) inside backward, replica 0 waits in the all-reduce;
* ``SkipCollective`` skips that all-reduce (the next one pairs with replica 0's pending one);
* ``StallAfterAllocating`` allocates ``STALL_MIB`` MiB, then spins (a busy stall);
* ``SleepBoth`` sleeps on every replica (no one is in a collective: the task bound decides);
* ``BiasUnreduced`` never reduces biases (replicas drift apart; no hang).

Run, from the repository root::

    python -m conformance run --ddp tests.outside.user_faults:HangInBackward --only parity.mlp \
        --world-size 2 --replica-timeout 10
"""
import time

import torch
from torch import nn

SECONDS = 600.0
STALL_MIB = 200
FAULT_STEP = 2  # 1-based training step of the fault


def _sleep_in_backward(seconds):
    time.sleep(seconds)  # the frame the report must show


def _stall_after_allocating(seconds):
    ballast = torch.ones(STALL_MIB * 2 ** 18)  # float32: STALL_MIB MiB, touched
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # busy, not asleep
        pass
    return ballast


class ScratchDDP(nn.Module):
    fault_rank = 1

    def __init__(self, module, broadcast_buffers=True, bucket_cap_mb=None, **unsupported):
        super().__init__()
        if unsupported:
            raise TypeError(f"{type(self).__name__} does not implement {sorted(unsupported)}")
        self.module = module
        p0 = next(module.parameters())
        self.xla = p0.device.type == "xla"
        if self.xla:
            import torch_xla.core.xla_model as xm
            import torch_xla.runtime as xr
            self.rank, self.world_size = xr.global_ordinal(), xr.world_size()
            xm.collective_broadcast(list(module.parameters()), root_ordinal=0)
        else:
            import torch.distributed as dist
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            for p in module.parameters():
                dist.broadcast(p.data, src=0)
        self.step, self._first = 0, False
        for name, p in module.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda p, name=name: self._hook(name, p))

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            self.step += 1
            self._first = True
        return self.module(*args, **kwargs)

    def fault(self, name, p) -> bool:
        """Called in each hook; True skips this parameter's all-reduce."""
        return False

    def _hook(self, name, p):
        first, self._first = self._first, False
        if first and self.rank == self.fault_rank and self.step == FAULT_STEP and self.fault(name, p):
            return
        if self.reduces(name):
            self._all_reduce(p.grad)

    def reduces(self, name) -> bool:
        return True

    def _all_reduce(self, grad):
        if self.xla:
            import torch_xla.core.xla_model as xm
            grad.copy_(xm.all_reduce(xm.REDUCE_SUM, grad, scale=1.0 / self.world_size))
        else:
            import torch.distributed as dist
            dist.all_reduce(grad)
            grad /= self.world_size


class HangInBackward(ScratchDDP):
    def fault(self, name, p):
        _sleep_in_backward(SECONDS)
        return False


class SkipCollective(ScratchDDP):
    def fault(self, name, p):
        return True


class StallAfterAllocating(ScratchDDP):
    def fault(self, name, p):
        _stall_after_allocating(SECONDS)
        return False


class SleepBoth(ScratchDDP):
    """Both replicas sleep 40 s in their first forward (outside any collective)."""

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.step == 0:
            time.sleep(40.0)
        return super().forward(*args, **kwargs)


class BiasUnreduced(ScratchDDP):
    def reduces(self, name):
        return not name.endswith("bias")
