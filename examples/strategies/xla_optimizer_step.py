"""torch_xla's data-parallel idiom, certified on the PJRT runtime: no wrapper, and
``xm.optimizer_step(optimizer)`` in place of ``optimizer.step()``.

``xm.optimizer_step`` all-reduces the gradients over the replicas (``xm.reduce_gradients``: sum,
scaled by ``1 / xr.world_size()``) and then calls ``optimizer.step()`` (torch_xla 2.9,
``torch_xla/core/xla_model.py``). At construction every replica takes replica 0's parameters
(and buffers) with ``xm.collective_broadcast`` - the body of ``xm.broadcast_master_param`` without
its trailing ``torch_xla.sync()``, which can deadlock between replica threads of one process
(docs/runtimes/pjrt.md, cause 3); the kit runs ``ctx.mark_step()`` after ``wrap`` and after every
step instead.

Run (from the repository root, torch_xla 2.9 installed)::

    PYTHONPATH=$PWD python -m conformance run --runtime pjrt --ddp examples.strategies.xla_optimizer_step:strategy
    PYTHONPATH=$PWD python -m conformance run --runtime pjrt --ddp examples.strategies.xla_optimizer_step:faulty

``faulty`` all-reduces the gradients without the ``1 / W`` scale (a sum, not a mean): exit 1.
"""
from __future__ import annotations

import dataclasses

import torch
import torch_xla.core.xla_model as xm

from conformance import Strategy

# DDP keywords with no counterpart here that leave the arithmetic unchanged (no gradient buckets).
IGNORED = frozenset({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph"})


def wrap(module: torch.nn.Module, ctx, ddp_kwargs: dict) -> torch.nn.Module:
    """Leave the model alone; broadcast replica 0's parameters (and, with ``broadcast_buffers``,
    its buffers, also before every training forward, as DDP does)."""
    unknown = sorted(set(ddp_kwargs) - IGNORED - {"broadcast_buffers"})
    if unknown:
        raise TypeError(f"xla_optimizer_step has no counterpart for keyword(s) {', '.join(unknown)}")
    broadcast_buffers = ddp_kwargs.get("broadcast_buffers", True)
    xm.collective_broadcast(list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []),
                            root_ordinal=0)
    if broadcast_buffers and any(True for _ in module.buffers()):
        def sync_buffers(mod, args):
            if torch.is_grad_enabled():
                xm.collective_broadcast(list(mod.buffers()), root_ordinal=0)
        module.register_forward_pre_hook(sync_buffers)
    return module


def optimizer_step(model, optimizer, ctx) -> None:
    xm.optimizer_step(optimizer)


def summed_step(model, optimizer, ctx) -> None:
    """The fault: the gradients' sum over the replicas, not their mean."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    xm.all_reduce(xm.REDUCE_SUM, grads, scale=1.0, pin_layout=True)
    optimizer.step()


strategy = Strategy(
    description="torch_xla's idiom: no wrapper, replica 0's parameters broadcast, "
                "xm.optimizer_step(optimizer) instead of optimizer.step()",
    wrap=wrap,
    optimizer_step=optimizer_step,
    ignores=IGNORED,
    unsupported={"cpu": "needs the XLA runtime (xm.collective_broadcast, xm.optimizer_step); "
                        "run it with --runtime pjrt",
                 "xrt": "certified on PJRT only"},
    unsupported_kinds={"property": "gradients are all-reduced inside xm.optimizer_step, so after backward "
                                   "a replica holds its local gradient, not the synchronised one the "
                                   "gradient properties read"},
    not_transparent={"module_hooks": "no wrapper: the buffer broadcast before a training forward is a "
                                     "forward pre-hook registered on the module itself"},
)

faulty = dataclasses.replace(strategy, optimizer_step=summed_step)
