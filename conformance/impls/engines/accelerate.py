"""Hugging Face accelerate: ``Accelerator(cpu=True)``, ``accelerator.prepare(model, optimizer)``
and ``accelerator.backward(loss)``, as its docs' quick tour wires them. Without ``cpu=True``
accelerate finds no accelerator and silently trains one process on its own (no
synchronisation). The DDP keywords travel as its ``DistributedDataParallelKwargs`` handler.
"""
from __future__ import annotations

import dataclasses
import weakref

from conformance.impls.engines import NOT_ON_PJRT, missing
from conformance.impls.engines._env import launcher_env
from conformance.impls.row import Strategy, refuse_keywords, torch_sync_bn

VERSION = "1.16.0"
_ACCELERATORS = weakref.WeakKeyDictionary()  # prepared model -> its Accelerator


def _wrap(module, ctx, kwargs, optimizer):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    accepted = {f.name for f in dataclasses.fields(DistributedDataParallelKwargs)}
    refuse_keywords("accelerate (DistributedDataParallelKwargs)", kwargs, accepted)
    with launcher_env(ctx):
        accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(**kwargs)])
        if accelerator.num_processes != ctx.world_size:
            raise RuntimeError(f"accelerate sees {accelerator.num_processes} process(es) in a world of "
                               f"{ctx.world_size}")
        model, opt = accelerator.prepare(module, optimizer)
    _ACCELERATORS[model] = accelerator
    return model, opt


def row() -> Strategy:
    """The ``accelerate`` row."""
    return Strategy(
        "accelerate", f"accelerate {VERSION}: Accelerator(cpu=True).prepare(model, optimizer), "
        "accelerator.backward(loss)", _wrap, optimizer_first=True,
        backward=lambda model, loss, optimizer, ctx: _ACCELERATORS[model].backward(loss),
        sync_batchnorm=torch_sync_bn, unsupported=dict(NOT_ON_PJRT),
        unavailable=missing("accelerate", VERSION, "accelerate"))
