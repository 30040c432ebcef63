"""Engines that cannot run on this kit's CPU runtime, as rows that skip with the measured
reason: megatron-core's ``DistributedDataParallel`` (its gradient buffer is allocated on the
CUDA device) and Horovod (its source distribution does not build against torch 2.13). Their
wiring (a CUDA device, Horovod's own launcher) is not written: the rows skip everywhere the kit
runs today.
"""
from __future__ import annotations

from conformance.errors import Unsupported
from conformance.impls.engines import NOT_ON_PJRT
from conformance.impls.row import Strategy

MEGATRON = ("megatron-core's DistributedDataParallel allocates its contiguous gradient buffer on "
            "torch.cuda.current_device(): it needs CUDA, which this runtime (CPU, gloo) does not have")
HOROVOD = ("horovod 0.28.1's source distribution does not build against torch 2.13: its build forces "
           "C++14, torch's headers need C++17 (pip install horovod fails compiling the torch extension)")


def _refuse(reason):
    def wrap(module, ctx, kwargs):
        raise Unsupported(reason)
    return wrap


def megatron_row() -> Strategy:
    """The ``megatron_core`` row: skips on CPU (needs CUDA)."""
    return Strategy("megatron_core", "megatron-core DistributedDataParallel (needs CUDA)", _refuse(MEGATRON),
                    unsupported=dict(NOT_ON_PJRT), unavailable=MEGATRON)


def horovod_row() -> Strategy:
    """The ``horovod`` row: skips (does not build against torch 2.13)."""
    return Strategy("horovod", "Horovod DistributedOptimizer (does not build against torch 2.13)",
                    _refuse(HOROVOD), unsupported=dict(NOT_ON_PJRT), unavailable=HOROVOD)
