"""The one training loop every runtime runs, and the run specification.

:func:`train_replica` is a World task: it runs on every replica, builds the
model (rank 0 from the run's seed, other ranks deliberately from other seeds and
with offset buffers, so only a DDP that broadcasts module states can match the
reference), wraps it in the implementation under test, trains ``steps`` steps on
the replica's shard of each global batch and returns the trajectory as numpy.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .tolerances import lookup

# Rank r != 0 builds its model from seed + RANK_SEED_STRIDE * r and adds
# r * RANK_BUFFER_OFFSET to its buffers before the DDP is constructed.
RANK_SEED_STRIDE = 7919
RANK_BUFFER_OFFSET = 0.5


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one training run (picklable, hashable)."""

    impl: str
    model: str
    lr: float
    steps: int
    global_batch: int
    seed: int
    dtype: str = "float32"
    broadcast_buffers: bool = True

    @classmethod
    def from_table(cls, runtime: str, impl: str, model: str, dtype: str = "float32", **overrides):
        """The run the tolerance table prescribes for ``(runtime, model, dtype)``."""
        tol = lookup(runtime, model, dtype)
        fields = dict(impl=impl, model=model, lr=tol.lr, steps=tol.steps,
                      global_batch=tol.global_batch, seed=tol.seed, dtype=dtype)
        fields.update(overrides)
        return cls(**fields)

    def as_dict(self) -> dict:
        return asdict(self)


def flat_params(module) -> np.ndarray:
    """All parameters of ``module`` concatenated, float32 ``[P]`` on the host."""
    import torch
    return torch.cat([p.detach().float().cpu().reshape(-1) for p in module.parameters()]).numpy()


def flat_buffers(module) -> np.ndarray:
    """All buffers of ``module`` concatenated as float64 ``[B]`` (``[0]`` when none)."""
    import torch
    bufs = [b.detach().double().cpu().reshape(-1) for b in module.buffers()]
    return torch.cat(bufs).numpy() if bufs else np.zeros(0)


def train_replica(ctx, spec: dict) -> dict:
    """World task: train one replica; return its trajectory.

    Returns a dict with ``params`` float32 ``[steps+1, P]`` (after DDP
    construction, then after each step), ``losses`` float64 ``[steps]`` (this
    replica's local mean loss), ``buffers`` float64 ``[steps+1, B]``, and
    ``shard`` (the shard index trained on).
    """
    import torch
    import torch.nn.functional as F

    from fixtures import build_model, global_batch, shard
    from fixtures.models import MODELS

    from .impls import resolve_impl

    run = RunSpec(**spec)
    impl = resolve_impl(run.impl)
    mspec = MODELS[run.model]
    model = build_model(run.model, seed=run.seed + RANK_SEED_STRIDE * ctx.rank,
                        perturb_buffers=RANK_BUFFER_OFFSET * ctx.rank)
    model.to(ctx.device)
    kwargs = dict(mspec.ddp_kwargs, broadcast_buffers=run.broadcast_buffers)
    ddp = impl.wrap(model, ctx, kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=run.lr)
    which = impl.shard_rank(ctx)
    params, losses, buffers = [flat_params(model)], [], [flat_buffers(model)]
    for step in range(run.steps):
        x, y = global_batch(run.model, run.seed, step, run.global_batch)
        xs = shard(x, which, ctx.world_size).to(ctx.device)
        ys = shard(y, which, ctx.world_size).to(ctx.device)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(ddp(xs), ys)
        loss.backward()
        if impl.after_backward is not None:
            impl.after_backward(ddp, opt, ctx)
        opt.step()
        ctx.mark_step()
        losses.append(float(loss.detach().cpu()))
        params.append(flat_params(model))
        buffers.append(flat_buffers(model))
    return {"params": np.stack(params), "losses": np.asarray(losses),
            "buffers": np.stack(buffers), "shard": which}
