"""The one training loop every runtime runs (the World task :func:`train_replica`), the run
specification, and the wrapping and optimizers every kind that builds replicas shares.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import numpy as np

from conformance.cases.shared.readback import (buffer_layout, flat_buffers, flat_optimizer_state, flat_params, optimizer_state_dict, optimizer_state_layout, param_layout, state_digest, to_device)
from conformance.tolerances import lookup
from conformance.cases.shared.setups import SETUPS, replica_groups
from conformance.cases.shared.transparency import merged, observed_wrap, probe_modes
from conformance.cases.shared.step import construct
from conformance.errors import Unsupported
from conformance.impls.builtin import resolve_impl
from fixtures import build_model, global_batch, shard
from fixtures.models import MODELS, training_loss

# Rank r != 0 builds its model from other seeds and with offset buffers (every kind that builds
# replicas does, :func:`rank_seed`, :func:`rank_buffer_offset`): only a DDP that broadcasts module
# states matches the reference.
RANK_SEED_STRIDE = 7919
RANK_BUFFER_OFFSET = 0.5


def rank_seed(seed: int, rank: int, salt: int = 0) -> int:
    """The seed replica ``rank`` builds its model from (``salt``: a rebuild, e.g. after a checkpoint)."""
    return seed + RANK_SEED_STRIDE * rank + salt


def rank_buffer_offset(rank: int, salt: float = 0.0) -> float:
    """What replica ``rank`` adds to its floating buffers before wrapping."""
    return RANK_BUFFER_OFFSET * rank + salt


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines one training run (picklable, hashable). ``setups`` names rows of
    :data:`conformance.cases.shared.setups.SETUPS`: each brings its own model conversion, forward
    context and per-step action, so this loop has no feature branches."""

    impl: str
    model: str
    lr: float
    steps: int
    global_batch: int
    seed: int
    dtype: str = "float32"
    broadcast_buffers: bool = True
    ddp_kwargs: tuple = ()      # extra DDP keywords as ((name, value), ...)
    requires: tuple = ()        # keywords/methods the implementation must honour
    momentum: float = 0.0       # SGD momentum (optimizer state for checkpoints)
    setups: tuple = ()          # names in conformance.cases.shared.setups.SETUPS

    @classmethod
    def from_table(cls, runtime: str, impl: str, model: str, dtype: str = "float32", **overrides):
        """The run the tolerance table prescribes for ``(runtime, model, dtype)``."""
        tol = lookup(runtime, model, dtype)
        return cls(**{**dict(impl=impl, model=model, lr=tol.lr, steps=tol.steps, global_batch=tol.global_batch,
                             seed=tol.seed, dtype=dtype), **overrides})

    def as_dict(self) -> dict:
        return asdict(self)


def mse(out, y):
    """The training loss: ``mse_loss`` in float32, or float64 for a float64 output (a float64
    model's gradients would otherwise carry float32 rounding; ``y`` is cast to match)."""
    import torch
    import torch.nn.functional as F
    out = out if out.dtype == torch.float64 else out.float()
    return F.mse_loss(out, y.to(out.dtype))


#: The kit's optimizers by name (a scenario draws one; a training run uses ``sgd``).
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw")
#: Every optimizer :func:`build_optimizer` builds: :data:`OPTIMIZERS` and ``sgd_wd`` (SGD with
#: weight decay, drawn by the loop programs: a ``None`` gradient skips a parameter, a zero
#: gradient still decays it, so the two differ).
ALL_OPTIMIZERS = OPTIMIZERS + ("sgd_wd",)
#: Weight decay of ``sgd_wd`` and ``adamw``.
WEIGHT_DECAY = 0.01

#: Adam's / AdamW's ``eps``. An element's update is about ``lr * g / (sqrt(v) + eps)``; where
#: ``g`` and ``v`` are near zero its sensitivity to a gradient difference approaches ``lr / eps``
#: (1e6 with torch's default 1e-8 at lr 0.01). XLA's gradients differ from CPU's in their last
#: float32 bits, and a near-zero one amplified that far moves a parameter of a correct DDP past
#: the 1e-5 bound (benchmarks/README.md, the PJRT searches). At 1e-3 the amplification is at most
#: 10; Adam's own faults (direction, state) still move parameters by ~lr.
ADAM_EPS = 1e-3
#: name -> (``torch.optim`` class, its keywords besides ``lr``; none: ``sgd``, the run's momentum)
#: of :func:`build_optimizer`.
OPTIMIZER_ROWS = {"sgd": ("SGD", {}), "sgd_momentum": ("SGD", {"momentum": 0.9}),
                  "sgd_wd": ("SGD", {"weight_decay": WEIGHT_DECAY}), "adam": ("Adam", {"eps": ADAM_EPS}),
                  "adamw": ("AdamW", {"eps": ADAM_EPS, "weight_decay": WEIGHT_DECAY})}


def build_optimizer(name: str, params, lr: float, momentum: float = 0.0):
    """Optimizer ``name`` of :data:`ALL_OPTIMIZERS` over ``params`` (:data:`OPTIMIZER_ROWS`;
    ``sgd`` with ``momentum``).

    Raises:
        ValueError: ``name`` is not one of :data:`ALL_OPTIMIZERS`."""
    import torch
    if name not in OPTIMIZER_ROWS:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(ALL_OPTIMIZERS)}")
    cls, kwargs = OPTIMIZER_ROWS[name]
    return getattr(torch.optim, cls)(params, lr=lr, **(kwargs or {"momentum": momentum}))


def make_optimizer(params, run: RunSpec, impl=None):
    """A training run's optimizer: ``impl.make_optimizer`` (a Strategy's), else SGD with the run's momentum."""
    if impl is not None and impl.make_optimizer is not None:
        return impl.make_optimizer(params, run)
    return build_optimizer("sgd", params, run.lr, run.momentum)


class Loop:
    """The state of one replica's training loop, handed to setups' hooks.

    Attributes: ``ctx``, ``run``, ``impl`` (the Strategy row), ``model`` (the inner
    module), ``engine`` (:class:`~conformance.cases.shared.step.Engine`), ``ddp`` (the wrapped
    model), ``opt`` (the engine's optimizer), ``setups``.
    """

    def __init__(self, ctx, run: RunSpec, impl, setups):
        self.ctx, self.run, self.impl, self.setups = ctx, run, impl, setups
        self.model = self.ddp = self.opt = self.engine = None
        self.observers = []  # one per wrap (a checkpoint reload wraps again)

    def fresh_model(self, salt: int = 0):
        """The run's model as this replica builds it: rank 0 from the run's seed,
        rank r from :func:`rank_seed` with buffers offset by :func:`rank_buffer_offset`
        (only a DDP that broadcasts module states matches)."""
        r = self.ctx.rank
        m = to_device(build_model(self.run.model, seed=rank_seed(self.run.seed, r, salt),
                                  perturb_buffers=rank_buffer_offset(r, salt)), self.ctx.device)
        for s in self.setups:
            m = s.prepare_model(m, self)
        probe_modes(m)
        return m

    @property
    def observer(self):
        """The :class:`~conformance.cases.shared.transparency.Observer` of the current DDP."""
        return self.observers[-1]

    def wrap(self):
        """Wrap :attr:`model` (observed), run the construction's collectives, build the optimizer."""
        kwargs = dict(MODELS[self.run.model].ddp_kwargs, broadcast_buffers=self.run.broadcast_buffers)
        kwargs.update(dict(self.run.ddp_kwargs))
        for s in self.setups:
            kwargs.update(s.ddp_kwargs(self))
        requires = tuple(self.run.requires) + tuple(r for s in self.setups for r in s.requires)
        with contextlib.ExitStack() as stack:
            for s in self.setups:
                stack.enter_context(s.construction_context(self))
            self.engine, obs = observed_wrap(self.impl, self.model, self.ctx, lambda: construct(
                self.impl, self.model, self.ctx, kwargs, lambda params: make_optimizer(params, self.run, self.impl), requires))
        self.ddp, self.opt = self.engine.model, self.engine.opt
        for old in self.observers:
            old.close()
        self.observers.append(obs)
        for s in self.setups:
            s.after_wrap(self)
        # Run the construction's broadcasts before reading parameters back: on XLA a
        # read (.cpu()) of a pending collective would compile it outside the step
        # lock, per replica, and the replicas' collectives would never meet.
        self.ctx.mark_step()


def train_replica(ctx, spec: dict) -> dict:
    """World task: train one replica; return its trajectory: ``params`` float32 ``[steps+1, P]``
    (after DDP construction, then after each step), ``losses`` float64 ``[steps]`` (this replica's
    local mean loss), ``buffers`` float64 ``[steps+1, B]``, ``optim`` (final optimizer state,
    float64), ``optim_digests`` (SHA-1 per step), ``shard`` (the shard index trained on),
    ``layout`` (``{"params" | "buffers" | "optim": [(name, shape), ...]}``: the tensors behind each
    flat vector, so verdicts can name them) and ``transparency`` (the observers' result).

    Raises:
        Unsupported: the implementation cannot serve the run (see :func:`conformance.cases.shared.step.wrap`).
    """
    run = RunSpec(**spec)
    loop = Loop(ctx, run, resolve_impl(run.impl), [SETUPS[n] for n in run.setups])
    if loop.impl.forward_backward is not None and MODELS[run.model].forward_kwargs:
        raise Unsupported(f"{loop.impl.name} brings its own step (forward_backward(model, inputs, loss_fn)), "
                          f"which passes no forward keywords; model {run.model} needs "
                          f"{sorted(MODELS[run.model].forward_kwargs)}")
    loop.model = loop.fresh_model()
    ctx.note(step=None, phase="DDP construction")
    loop.wrap()
    which = loop.impl.shard_rank(ctx)
    # This replica's data-parallel job (the whole world unless a setup splits it): the
    # job's global batch is seeded by its first rank, sharded over its members.
    group = next(g for g in replica_groups(loop.setups, ctx.world_size) if ctx.rank in g)
    data_seed = rank_seed(run.seed, group[0])
    index = group.index(which) if which in group else which % len(group)
    with loop.engine.full_params(loop.model):
        params, losses, buffers = [flat_params(loop.model)], [], [flat_buffers(loop.model)]
    digests = []

    def full_state():  # the optimizer's full state dict where sharded (a collective), else None: opt.state
        return optimizer_state_dict(loop.impl, loop.opt, ctx) if loop.impl.optimizer_state_dict else None
    for step in range(run.steps):
        x, y = global_batch(run.model, data_seed, step, run.global_batch)
        loss = _train_step(loop, step, shard(x, index, len(group)).to(ctx.device),
                           shard(y, index, len(group)).to(ctx.device))
        losses.append(float(loss.detach().cpu()))
        with loop.engine.full_params(loop.model):
            params.append(flat_params(loop.model))
        buffers.append(flat_buffers(loop.model))
        digests.append(state_digest(flat_optimizer_state(loop.opt, full_state())))
        for s in loop.setups:
            s.after_step(loop, step)
    final = full_state()  # kept for the names too
    with loop.engine.full_params(loop.model):
        shapes = param_layout(loop.model)
    layout = {"params": shapes, "buffers": buffer_layout(loop.model),
              "optim": optimizer_state_layout(loop.opt, final, loop.model)}
    return {"params": np.stack(params), "losses": np.asarray(losses),
            "buffers": np.stack(buffers), "optim": flat_optimizer_state(loop.opt, final),
            "optim_digests": digests, "shard": which, "layout": layout, "transparency": merged(loop.observers)}


def _train_step(loop: Loop, step: int, xs, ys):
    """One optimizer step (0-based ``step``) of :func:`train_replica` on this replica's shard
    ``xs``, ``ys`` (on the device), observed; returns the local loss."""
    ctx, run, engine = loop.ctx, loop.run, loop.engine
    engine.zero_grad()
    ctx.note(step=step + 1, phase="forward")  # 1-based, as verdicts count
    engine.before_forward()
    with contextlib.ExitStack() as stack:
        for s in loop.setups:
            stack.enter_context(s.forward_context(loop, step))
        if loop.impl.forward_backward is not None:  # one compiled forward+loss+backward
            loss = loop.impl.forward_backward(loop.ddp, xs, lambda out: training_loss(run.model, out, ys))
            loop.observer.forward_unseen()
        else:
            out = loop.observer.call(loop.ddp, xs, **MODELS[run.model].forward_kwargs)
    obs = loop.observer
    if loop.impl.forward_backward is None:
        loss = training_loss(run.model, out, ys)
        ctx.note(phase="backward")  # DDP's gradient all-reduces run here
        with obs.unchanged_by("backward"):
            engine.backward(loss)
    engine.sync()
    ctx.note(phase="optimizer step")
    with obs.unchanged_by("the optimizer step"):
        engine.step()
    ctx.mark_step()
    obs.after_step(step + 1)
    return loss
