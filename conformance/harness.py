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
    # Feature options (see conformance.features):
    ddp_kwargs: tuple = ()      # extra DDP keywords as ((name, value), ...)
    requires: tuple = ()        # keywords/methods the implementation must honour
    comm_hook: str = ""         # "allreduce": torch's default all-reduce comm hook
    autocast: str = ""          # "bfloat16": forward under torch.autocast
    momentum: float = 0.0       # SGD momentum (optimizer state for checkpoints)
    checkpoint: str = ""        # "ddp" / "module": save+reload mid-run from that state_dict
    sync_bn: bool = False       # convert BatchNorm to the implementation's SyncBatchNorm

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
    """All parameters of ``module`` concatenated, float32 ``[P]`` on the host
    (full tensors, in ``parameters()`` order, also for DTensor-sharded ones)."""
    import torch
    # Sharded (DTensor) parameters are gathered first: a collective, every replica reads.
    ps = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in module.parameters()]
    # .cpu() first: on XLA a dtype cast would be a device graph compiled per read.
    return torch.cat([p.detach().cpu().float().reshape(-1) for p in ps]).numpy()


def flat_buffers(module) -> np.ndarray:
    """All buffers of ``module`` concatenated as float64 ``[B]`` (``[0]`` when none)."""
    import torch
    bufs = [b.detach().cpu().double().reshape(-1) for b in module.buffers()]
    return torch.cat(bufs).numpy() if bufs else np.zeros(0)


def to_device(module, device):
    """``module.to(device)``, keeping tied (shared) parameters tied.

    Moving to an XLA device gives every module its own new Parameter (the CPU
    and XLA tensors are not shallow-copy compatible), so a weight shared by two
    modules becomes two (measured on torch_xla 2.9); the sharing is restored here
    as it was on the CPU module.
    """
    ties = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for name, p in mod._parameters.items():
            if p is not None:
                ties.setdefault(id(p), []).append((mod_name, name))
    module = module.to(device)
    mods = dict(module.named_modules(remove_duplicate=False))
    for places in ties.values():
        (m0, n0), rest = places[0], places[1:]
        first = mods[m0]._parameters[n0]
        for m, n in rest:
            if mods[m]._parameters[n] is not first:
                mods[m]._parameters[n] = first
    return module


def to_cpu(obj):
    """``obj`` (nested dicts/lists of tensors) with every tensor copied to the host,
    as ``torch_xla``'s ``xm.save`` does before saving: XLA-device storages cannot
    be restored by ``torch.load``."""
    import copy

    import torch
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        out = copy.copy(obj)  # same type and attributes (a state_dict's _metadata)
        for k, v in obj.items():
            out[k] = to_cpu(v)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def unsupported_reason(ddp, impl_name: str, requires) -> str | None:
    """Why ``ddp`` cannot serve a feature needing ``requires``, or ``None``.

    A keyword counts as unsupported when the implementation reports it in
    ``ddp.ignored_kwargs`` (the reference DDP does, with a warning) or the
    implementation's row lists it in ``Impl.unsupported_features``; a method
    (``join``, ``register_comm_hook``, ``no_sync``) when the object lacks it. A
    wrap that cannot serve the run at all sets ``ddp.conformance_unsupported``.
    """
    if getattr(ddp, "conformance_unsupported", None):  # set by a wrap that cannot serve this run
        return f"{impl_name}: {ddp.conformance_unsupported}"
    from .impls import IMPLS
    lacks = IMPLS[impl_name].unsupported_features if impl_name in IMPLS else {}
    ignored = set(getattr(ddp, "ignored_kwargs", None) or ())
    for need in requires:
        if need in lacks:
            return f"{impl_name}: {lacks[need]}"
        if need in ignored:
            return f"{impl_name} ignores constructor argument {need}"
        if need in ("join", "register_comm_hook", "no_sync") and not callable(getattr(ddp, need, None)):
            return f"{impl_name} has no {need}()"
    return None


def make_optimizer(params, run: RunSpec):
    import torch
    return torch.optim.SGD(params, lr=run.lr, momentum=run.momentum)


def flat_optimizer_state(opt, state_dict=None) -> np.ndarray:
    """Every tensor of the optimizer state (e.g. momentum buffers) concatenated, float64;
    from ``state_dict["state"]`` (per parameter index) when a full state dict is given."""
    import torch
    states = opt.state.values() if state_dict is None else [
        state_dict["state"][k] for k in sorted(state_dict["state"])]
    ts = [v.detach().cpu().double().reshape(-1) for st in states
          for v in st.values() if torch.is_tensor(v) and v.dim() > 0]
    return torch.cat(ts).numpy() if ts else np.zeros(0)


def _autocast(run: RunSpec, device):
    import contextlib

    import torch
    if not run.autocast:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, run.autocast))


def _wrap(impl, model, ctx, run: RunSpec):
    from fixtures.models import MODELS
    kwargs = dict(MODELS[run.model].ddp_kwargs, broadcast_buffers=run.broadcast_buffers)
    kwargs.update(dict(run.ddp_kwargs))
    ddp = impl.wrap(model, ctx, kwargs)
    if run.comm_hook:
        if callable(getattr(ddp, "register_comm_hook", None)):
            ddp.register_comm_hook(None, comm_hook(run.comm_hook))
    return ddp


def comm_hook(name: str):
    """Communication hooks by name (torch's ``ddp_comm_hooks``)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return {"allreduce": default_hooks.allreduce_hook}[name]


def train_replica(ctx, spec: dict) -> dict:
    """World task: train one replica; return its trajectory.

    Returns a dict with ``params`` float32 ``[steps+1, P]`` (after DDP
    construction, then after each step), ``losses`` float64 ``[steps]`` (this
    replica's local mean loss), ``buffers`` float64 ``[steps+1, B]``, ``optim``
    (final optimizer state, float64) and ``shard`` (the shard index trained on);
    or ``{"unsupported": reason}`` when the implementation cannot serve the run.
    With ``checkpoint`` set, after step ``steps // 2`` the model and optimizer are
    saved (``torch.save``), rebuilt from other seeds, reloaded, re-wrapped.
    """
    import io

    import torch
    import torch.nn.functional as F

    from fixtures import build_model, global_batch, shard

    from .impls import resolve_impl

    run = RunSpec(**spec)
    impl = resolve_impl(run.impl)

    def fresh_model(salt=0):
        m = to_device(build_model(run.model, seed=run.seed + RANK_SEED_STRIDE * ctx.rank + salt,
                                  perturb_buffers=RANK_BUFFER_OFFSET * ctx.rank + salt), ctx.device)
        if run.sync_bn:
            m = impl.sync_batchnorm(m, ctx)
        return m

    if run.sync_bn and impl.sync_batchnorm is None:
        return {"unsupported": f"{run.impl} has no SyncBatchNorm"}
    model = fresh_model()
    try:
        ddp = _wrap(impl, model, ctx, run)
    except ValueError as exc:
        if run.sync_bn and "SyncBatchNorm" in str(exc):  # torch's refuses CPU modules
            return {"unsupported": f"{type(exc).__name__}: {exc}"}
        raise
    why = unsupported_reason(ddp, run.impl, run.requires + (("register_comm_hook",) if run.comm_hook else ()))
    if why:
        return {"unsupported": why}
    # Run the construction's broadcasts before reading parameters back: on XLA a
    # read (.cpu()) of a pending collective would compile it outside the step
    # lock, per replica, and the replicas' collectives would never meet.
    ctx.mark_step()
    new_optimizer = impl.make_optimizer or make_optimizer
    opt = new_optimizer(ddp.parameters(), run)
    which = impl.shard_rank(ctx)
    params, losses, buffers = [flat_params(model)], [], [flat_buffers(model)]
    for step in range(run.steps):
        x, y = global_batch(run.model, run.seed, step, run.global_batch)
        xs = shard(x, which, ctx.world_size).to(ctx.device)
        ys = shard(y, which, ctx.world_size).to(ctx.device)
        opt.zero_grad(set_to_none=True)
        try:
            with _autocast(run, ctx.device):
                if impl.forward_backward is not None:
                    loss = impl.forward_backward(ddp, xs, lambda out: F.mse_loss(out.float(), ys))
                else:
                    out = ddp(xs)
        except ValueError as exc:
            if run.sync_bn and step == 0 and "SyncBatchNorm" in str(exc):
                return {"unsupported": f"{type(exc).__name__}: {exc}"}  # e.g. torch's on CPU
            raise
        if impl.forward_backward is None:
            loss = F.mse_loss(out.float(), ys)
            loss.backward()
        if impl.after_backward is not None:
            impl.after_backward(ddp, opt, ctx)
        opt.step()
        ctx.mark_step()
        losses.append(float(loss.detach().cpu()))
        params.append(flat_params(model))
        buffers.append(flat_buffers(model))
        if run.checkpoint and step == run.steps // 2:
            blob = io.BytesIO()
            state = ddp.state_dict() if run.checkpoint == "ddp" else model.state_dict()  # the inner module
            torch.save(to_cpu({"model": state, "optim": _optim_state(impl, opt, ctx)}), blob)
            blob.seek(0)
            saved = torch.load(blob, map_location="cpu")  # load_state_dict copies to the device
            model = fresh_model(salt=1)
            torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(saved["model"], "module.")
            model.load_state_dict(saved["model"])
            ddp = _wrap(impl, model, ctx, run)
            ctx.mark_step()
            opt = new_optimizer(ddp.parameters(), run)
            opt.load_state_dict(saved["optim"])
    return {"params": np.stack(params), "losses": np.asarray(losses),
            "buffers": np.stack(buffers), "shard": which,
            "optim": flat_optimizer_state(opt, impl.optimizer_state_dict and _optim_state(impl, opt, ctx))}


def _optim_state(impl, opt, ctx) -> dict:
    """The optimizer's full state dict (``Impl.optimizer_state_dict`` for sharded ones)."""
    return impl.optimizer_state_dict(opt, ctx) if impl.optimizer_state_dict else opt.state_dict()
