"""SPMD data parallelism with torch_xla, certified on the PJRT runtime (``spmd`` topology).

One program drives every device: under ``xr.use_spmd()`` tensors are global, and XLA's
partitioner splits the work along a device mesh (torch_xla's SPMD user guide). Data parallelism
is one annotation: the batch is sharded along a 1-D ``data`` mesh with ``xs.mark_sharding``,
the parameters stay replicated (the default), and the partitioner inserts the gradient
all-reduce. The strategy asks the kit for that topology (``topology={"pjrt": "spmd"}``): the kit
then runs one host process with ``xr.use_spmd()`` set and a W-device mesh
(``ctx.extra["mesh_devices"]``), and one training context on the whole global batch. There are no
per-replica copies (``holds_copies=False``: replica agreement is skipped with the reason), and
per-replica case kinds (tasks, properties, scenarios) have no replica to drive.

Because sharding never changes what a program computes, an unsharded input would still pass
parity while testing nothing: :func:`require_sharded` fails such a step.

Run (from the repository root, torch_xla 2.9 installed)::

    PYTHONPATH=$PWD python -m conformance run --runtime pjrt --ddp examples.strategies.xla_spmd_dp:strategy
    PYTHONPATH=$PWD python -m conformance run --runtime pjrt --ddp examples.strategies.xla_spmd_dp:faulty

``faulty`` keeps a DDP habit - dividing the gradients by the number of devices - which SPMD's
global loss has already done: exit 1.
"""
from __future__ import annotations

import dataclasses
import weakref

import numpy as np
import torch
import torch_xla.distributed.spmd as xs

from conformance import Strategy
from conformance.errors import Unsupported

# DDP keywords without an SPMD counterpart that leave the arithmetic unchanged.
IGNORED = frozenset({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "find_unused_parameters"})
PER_REPLICA = "one SPMD program over the mesh has no per-replica Python, gradients or control flow to drive"

_INPUT_SHARDING = weakref.WeakKeyDictionary()  # model -> sharding spec of its last input


def wrap(module: torch.nn.Module, ctx, ddp_kwargs: dict) -> torch.nn.Module:
    """Shard every forward's tensor inputs along dim 0 over a 1-D ``data`` mesh of
    ``ctx.extra["mesh_devices"]`` devices; parameters stay replicated."""
    unknown = sorted(set(ddp_kwargs) - IGNORED - {"broadcast_buffers"})
    if unknown:
        raise TypeError(f"xla_spmd_dp has no counterpart for keyword(s) {', '.join(unknown)}")
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm):
            raise Unsupported(f"plain {type(m).__name__} ({name or 'the model'!r}): SPMD computes BatchNorm "
                              "statistics over the global batch; DDP's per-replica ones cannot be expressed")
    n = ctx.extra["mesh_devices"]
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))

    def shard_batch(mod, args):
        for a in args:
            if isinstance(a, torch.Tensor):
                sharded = xs.mark_sharding(a, mesh, ("data",) + (None,) * (a.dim() - 1))
                _INPUT_SHARDING[mod] = sharded.sharding_spec
    module.register_forward_pre_hook(shard_batch)
    return module


def require_sharded(model, optimizer, ctx) -> None:
    """Fail a step whose input was not sharded over the mesh (one device's training)."""
    spec = _INPUT_SHARDING.get(model, "")
    if not spec or "replicated" in spec:
        raise RuntimeError(f"the step's input was not sharded over the mesh (sharding {spec!r})")


def divide_by_devices(model, optimizer, ctx) -> None:
    """The fault: DDP's per-replica averaging on top of SPMD's global mean."""
    require_sharded(model, optimizer, ctx)
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(ctx.extra["mesh_devices"])


strategy = Strategy(
    description="torch_xla SPMD data parallel: batch sharded over a 1-D 'data' mesh with xs.mark_sharding, "
                "parameters replicated",
    wrap=wrap,
    after_backward=require_sharded,
    sync_batchnorm=lambda module, ctx: torch.nn.SyncBatchNorm.convert_sync_batchnorm(module),
    ignores=IGNORED,
    topology={"pjrt": "spmd"},
    holds_copies=False,
    no_copies_reason="runs one SPMD program over the mesh: parameters are global tensors, no per-replica "
                     "copies to agree",
    unsupported={"cpu": "needs torch_xla's SPMD (xr.use_spmd) on the PJRT runtime; run it with --runtime pjrt",
                 "xrt": "SPMD needs PJRT"},
    unsupported_kinds={"task": PER_REPLICA, "property": PER_REPLICA, "scenario": PER_REPLICA},
    not_transparent={"module_hooks": "no wrapper: the input is sharded by a forward pre-hook registered on the "
                                     "module itself"},
)

faulty = dataclasses.replace(strategy, after_backward=divide_by_devices)
