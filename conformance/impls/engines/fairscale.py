"""fairscale 0.4.13: ``ShardedDataParallel`` with the ``OSS`` optimizer, as its docs wire them
(fairscale.readthedocs.io, "ShardedDDP"): the sharded optimizer is built first, the wrapper
around the module and it; every gradient is reduced to the rank owning its optimizer shard
(the others drop theirs), ``OSS.step()`` updates the owned shard and broadcasts parameters.
"""
from __future__ import annotations

import inspect

from conformance.impls.engines import NOT_ON_PJRT, missing
from conformance.impls.row import Strategy, refuse_keywords, torch_sync_bn

VERSION = "0.4.13"
#: DDP keywords ShardedDataParallel has a counterpart for.
ACCEPTED = ("broadcast_buffers", "process_group")


def _wrap(module, ctx, kwargs, optimizer):
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim.oss import OSS
    refuse_keywords("fairscale ShardedDataParallel", kwargs, ACCEPTED)
    takes = inspect.signature(type(optimizer)).parameters  # defaults hold keys __init__ does not take
    oss = OSS([p for g in optimizer.param_groups for p in g["params"]], optim=type(optimizer),
              group=kwargs.get("process_group"), **{k: v for k, v in optimizer.defaults.items() if k in takes})
    return ShardedDataParallel(module, oss, **kwargs), oss


def _gather_grads(module, model, optimizer, ctx):
    """Each gradient broadcast from the rank owning its shard (``OSS._param_to_rank``); a flag
    first, so a ``None`` gradient stays ``None``."""
    import torch
    import torch.distributed as dist
    out = []
    for p in module.parameters():
        owner = optimizer._param_to_rank[p] if p in optimizer._param_to_rank else None
        if owner is None:  # frozen: no shard, no reduction
            out.append(p.grad)
            continue
        src = dist.get_global_rank(optimizer.group, owner) if optimizer.group is not None else owner
        mine = ctx.rank == src
        has = torch.tensor([1 if mine and p.grad is not None else 0])
        dist.broadcast(has, src=src)
        if not has.item():
            out.append(None)
            continue
        g = p.grad.detach().clone() if mine else torch.empty_like(p)
        dist.broadcast(g, src=src)
        out.append(g)
    return out


def row() -> Strategy:
    """The ``fairscale`` row."""
    return Strategy(
        "fairscale", f"fairscale {VERSION} ShardedDataParallel + OSS (gradients reduced to the shard owner)",
        _wrap, optimizer_first=True,
        zero_grad=lambda model, optimizer, ctx: model.zero_grad(set_to_none=True),
        optimizer_state_dict=lambda optimizer, ctx: optimizer.state_dict(all_ranks=True),
        gather_grads=_gather_grads, sync_batchnorm=torch_sync_bn, unsupported=dict(NOT_ON_PJRT),
        unavailable=missing("fairscale", VERSION, "fairscale"))
