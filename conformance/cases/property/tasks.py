"""World tasks of the gradient-sync properties (replicas, pickled by reference):
``fn(ctx, *, impl, **payload)`` builds a model, wraps it with ``resolve_impl(impl).wrap(module,
ctx, {})``, runs one or a few backward passes and returns numpy."""
from __future__ import annotations

import numpy as np

from conformance.cases.property.models import (build_bn_net, build_mlp, grads_of, host_copy, one_param_module,
                                                 state_of, torch_dtype)
from conformance.cases.shared.loop import rank_seed
from conformance.impls.builtin import resolve_impl


def _wrap(impl: str, module, ctx):
    import torch

    row = resolve_impl(impl)
    module.to(ctx.device)
    ddp = row.wrap(module, ctx, {})
    opt = torch.optim.SGD(module.parameters(), lr=0.0)  # only for after_backward recipes
    return row, ddp, opt


def _after_backward(row, ddp, opt, ctx):
    if row.after_backward is not None:
        row.after_backward(ddp, opt, ctx)
    ctx.mark_step()


def allreduce_mean_task(ctx, *, impl: str, xs: list, dtype: str) -> dict:
    """Property 1: push ``xs[shard]`` through the DDP as the gradient of a
    one-parameter module; return the synced gradient (as float32) and its dtype."""
    import torch
    module = one_param_module(np.shape(xs[0]), dtype)
    row, ddp, opt = _wrap(impl, module, ctx)
    x = torch.from_numpy(np.array(xs[row.shard_rank(ctx)], dtype=np.float32).reshape(-1))
    # Moved as 1-d and reshaped on the device: torch_xla inlines a 0-dim 0.0 or
    # 1.0 as a constant, so a rank-dependent scalar would give replicas different
    # graphs (and XLA collectives that never meet).
    x = x.to(torch_dtype(dtype)).to(ctx.device).reshape(np.shape(xs[0]))
    ddp(x).backward()
    _after_backward(row, ddp, opt, ctx)
    g = module.p.grad
    return {"grad": host_copy(g).float().numpy().copy(), "dtype": str(g.dtype).replace("torch.", "")}


def _shard(a, index: int, world_size: int):
    import torch
    n = len(a) // world_size
    return torch.from_numpy(np.ascontiguousarray(a[index * n:(index + 1) * n]))


def _mse_step(ddp, x, y, ctx, scale=1.0):
    import torch.nn.functional as F
    loss = F.mse_loss(ddp(x.to(ctx.device)), y.to(ctx.device))
    (loss * scale if scale != 1.0 else loss).backward()


def mlp_grad_task(ctx, *, impl: str, widths, seed: int, x, y, perm=None) -> dict:
    """Properties 2 and 3: one synced backward of the mean MSE on this replica's
    shard of ``x[0], y[0]``; with ``perm`` a second one (grads zeroed) on shard
    ``perm[shard]``. Returns ``{"grads": [...], "perm_grads": [...] or None}``."""
    module = build_mlp(widths, seed)
    row, ddp, opt = _wrap(impl, module, ctx)
    s, w = row.shard_rank(ctx), ctx.world_size
    _mse_step(ddp, _shard(x[0], s, w), _shard(y[0], s, w), ctx)
    _after_backward(row, ddp, opt, ctx)
    out = {"grads": grads_of(module), "perm_grads": None}
    if perm is not None:
        opt.zero_grad(set_to_none=True)
        _mse_step(ddp, _shard(x[0], perm[s], w), _shard(y[0], perm[s], w), ctx)
        _after_backward(row, ddp, opt, ctx)
        out["perm_grads"] = grads_of(module)
    return out


def broadcast_task(ctx, *, impl: str, widths, seed: int) -> dict:
    """Property 4: build the BatchNorm net from a rank-dependent seed, wrap it,
    wrap its module again; return the state before, after the first and after
    the second construction."""
    module = build_bn_net(widths, rank_seed(seed, ctx.rank))
    module.to(ctx.device)
    before = state_of(module)
    row = resolve_impl(impl)
    row.wrap(module, ctx, {})
    ctx.mark_step()
    first = state_of(module)
    row.wrap(module, ctx, {})
    ctx.mark_step()
    return {"before": before, "first": first, "second": state_of(module)}


def no_sync_task(ctx, *, impl: str, widths, seed: int, x, y) -> dict:
    """Property 5: ``len(x) - 1`` backward passes under ``ddp.no_sync()``, then
    one synced backward; returns the gradients. Raises ``Unsupported`` when the
    DDP has no ``no_sync``."""
    module = build_mlp(widths, seed)
    row, ddp, opt = _wrap(impl, module, ctx)
    if not callable(getattr(ddp, "no_sync", None)):
        from conformance.errors import Unsupported
        raise Unsupported(f"{impl} has no no_sync()")
    s, w = row.shard_rank(ctx), ctx.world_size
    for j in range(len(x) - 1):
        with ddp.no_sync():
            _mse_step(ddp, _shard(x[j], s, w), _shard(y[j], s, w), ctx)
        ctx.mark_step()
    _mse_step(ddp, _shard(x[-1], s, w), _shard(y[-1], s, w), ctx)
    _after_backward(row, ddp, opt, ctx)
    return {"grads": grads_of(module)}


def scaled_grad_task(ctx, *, impl: str, widths, seed: int, x, y, c: float) -> dict:
    """Property 6: synced gradients of the loss and (grads zeroed) of ``c * loss``."""
    module = build_mlp(widths, seed)
    row, ddp, opt = _wrap(impl, module, ctx)
    s, w = row.shard_rank(ctx), ctx.world_size
    xs, ys = _shard(x[0], s, w), _shard(y[0], s, w)
    _mse_step(ddp, xs, ys, ctx)
    _after_backward(row, ddp, opt, ctx)
    plain = grads_of(module)
    opt.zero_grad(set_to_none=True)
    _mse_step(ddp, xs, ys, ctx, scale=c)
    _after_backward(row, ddp, opt, ctx)
    return {"grads": plain, "scaled_grads": grads_of(module)}
