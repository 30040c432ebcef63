"""World tasks of the gradient-sync properties (replicas, pickled by reference):
``fn(ctx, *, impl, **payload)`` builds a model through the strategy's step protocol with no
keywords (``conformance.cases.shared.step.construct``), runs one or a few synchronised backward
passes and returns numpy."""
from __future__ import annotations

import numpy as np

from conformance.cases.property.models import (build_bn_net, build_mlp, host_copy, one_param_module,
                                                 state_of, torch_dtype)
from conformance.cases.shared.loop import rank_seed
from conformance.cases.shared.step import construct
from conformance.impls.builtin import resolve_impl


def _wrap(impl: str, module, ctx):
    """``(row, engine)``: ``module`` on the device built through the strategy's step protocol,
    with no keywords and an ``SGD(lr=0)`` (the properties read gradients, never step)."""
    import torch

    row = resolve_impl(impl)
    module.to(ctx.device)
    return row, construct(row, module, ctx, {}, lambda params: torch.optim.SGD(params, lr=0.0))


def _backward(engine, loss, ctx):
    """One synchronised backward: the engine's hooks around ``loss``'s backward, then the step
    sync, as the training loop runs them."""
    engine.backward(loss)
    engine.sync()
    ctx.mark_step()


def _grads(engine, module) -> list:
    """``[(name, float32 numpy grad or None)]`` where the strategy keeps its gradients."""
    names = [n for n, _ in module.named_parameters()]
    return [(n, None if g is None else host_copy(g).float().numpy().copy())
            for n, g in zip(names, engine.grads(module))]


def allreduce_mean_task(ctx, *, impl: str, xs: list, dtype: str) -> dict:
    """Property 1: push ``xs[shard]`` through the DDP as the gradient of a
    one-parameter module; return the synced gradient (as float32) and its dtype."""
    import torch
    module = one_param_module(np.shape(xs[0]), dtype)
    row, engine = _wrap(impl, module, ctx)
    x = torch.from_numpy(np.array(xs[row.shard_rank(ctx)], dtype=np.float32).reshape(-1))
    # Moved as 1-d and reshaped on the device: torch_xla inlines a 0-dim 0.0 or
    # 1.0 as a constant, so a rank-dependent scalar would give replicas different
    # graphs (and XLA collectives that never meet).
    x = x.to(torch_dtype(dtype)).to(ctx.device).reshape(np.shape(xs[0]))
    engine.before_forward()
    _backward(engine, engine.model(x), ctx)
    g = engine.grads(module)[0]
    return {"grad": host_copy(g).float().numpy().copy(), "dtype": str(g.dtype).replace("torch.", "")}


def _shard(a, index: int, world_size: int):
    import torch
    n = len(a) // world_size
    return torch.from_numpy(np.ascontiguousarray(a[index * n:(index + 1) * n]))


def _mse_step(engine, x, y, ctx, scale=1.0):
    """One synchronised backward of the mean MSE of ``x``, ``y`` (times ``scale``)."""
    import torch.nn.functional as F
    engine.before_forward()
    loss = F.mse_loss(engine.model(x.to(ctx.device)), y.to(ctx.device))
    _backward(engine, loss * scale if scale != 1.0 else loss, ctx)


def mlp_grad_task(ctx, *, impl: str, widths, seed: int, x, y, perm=None) -> dict:
    """Properties 2 and 3: one synced backward of the mean MSE on this replica's
    shard of ``x[0], y[0]``; with ``perm`` a second one (grads zeroed) on shard
    ``perm[shard]``. Returns ``{"grads": [...], "perm_grads": [...] or None}``."""
    module = build_mlp(widths, seed)
    row, engine = _wrap(impl, module, ctx)
    s, w = row.shard_rank(ctx), ctx.world_size
    _mse_step(engine, _shard(x[0], s, w), _shard(y[0], s, w), ctx)
    out = {"grads": _grads(engine, module), "perm_grads": None}
    if perm is not None:
        engine.zero_grad()
        _mse_step(engine, _shard(x[0], perm[s], w), _shard(y[0], perm[s], w), ctx)
        out["perm_grads"] = _grads(engine, module)
    return out


def broadcast_task(ctx, *, impl: str, widths, seed: int) -> dict:
    """Property 4: build the BatchNorm net from a rank-dependent seed, wrap it,
    wrap its module again; return the state before, after the first and after
    the second construction."""
    module = build_bn_net(widths, rank_seed(seed, ctx.rank))
    module.to(ctx.device)
    before = state_of(module)
    _wrap(impl, module, ctx)
    ctx.mark_step()
    first = state_of(module)
    _wrap(impl, module, ctx)
    ctx.mark_step()
    return {"before": before, "first": first, "second": state_of(module)}


def no_sync_task(ctx, *, impl: str, widths, seed: int, x, y) -> dict:
    """Property 5: ``len(x) - 1`` backward passes under ``ddp.no_sync()``, then
    one synced backward; returns the gradients. Raises ``Unsupported`` when the
    DDP has no ``no_sync``."""
    import torch.nn.functional as F
    module = build_mlp(widths, seed)
    row, engine = _wrap(impl, module, ctx)
    ddp = engine.model
    if not callable(getattr(ddp, "no_sync", None)):
        from conformance.errors import Unsupported
        raise Unsupported(f"{impl} has no no_sync()")
    s, w = row.shard_rank(ctx), ctx.world_size
    engine.before_forward()
    for j in range(len(x) - 1):
        with ddp.no_sync():
            loss = F.mse_loss(ddp(_shard(x[j], s, w).to(ctx.device)), _shard(y[j], s, w).to(ctx.device))
            engine.backward(loss)
        ctx.mark_step()
    loss = F.mse_loss(ddp(_shard(x[-1], s, w).to(ctx.device)), _shard(y[-1], s, w).to(ctx.device))
    _backward(engine, loss, ctx)
    return {"grads": _grads(engine, module)}


def scaled_grad_task(ctx, *, impl: str, widths, seed: int, x, y, c: float) -> dict:
    """Property 6: synced gradients of the loss and (grads zeroed) of ``c * loss``."""
    module = build_mlp(widths, seed)
    row, engine = _wrap(impl, module, ctx)
    s, w = row.shard_rank(ctx), ctx.world_size
    xs, ys = _shard(x[0], s, w), _shard(y[0], s, w)
    _mse_step(engine, xs, ys, ctx)
    plain = _grads(engine, module)
    engine.zero_grad()
    _mse_step(engine, xs, ys, ctx, scale=c)
    return {"grads": plain, "scaled_grads": _grads(engine, module)}
