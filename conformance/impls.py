"""The table of DDP implementations under test, and ``--ddp`` spec resolution.

A spec is a table key (``torch``, ``ref``, ...), ``mutant:<name>`` (see
:mod:`conformance.mutants`), or ``package.module:Class`` for a user's own DDP.
A user class is constructed like ``torch.nn.parallel.DistributedDataParallel``:
``Class(module, **ddp_kwargs)`` inside a replica whose torch.distributed default
group (CPU runtime) or XLA runtime (PJRT) is initialised.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable


class ImplSpecError(ValueError):
    """A ``--ddp`` spec that names nothing usable; ``str(exc)`` is one line."""


def _replica_rank(ctx):
    return ctx.rank


@dataclass(frozen=True)
class Impl:
    """One DDP implementation under test.

    Attributes:
        name: the spec that selects it.
        description: one line for reports.
        wrap: ``wrap(module, ctx, ddp_kwargs) -> module`` builds the wrapped model.
        after_backward: optional ``f(model, optimizer, ctx)`` run between
            backward and ``optimizer.step()`` (recipes that sync there).
        unsupported: runtime name -> reason the implementation cannot run there.
        shard_rank: which shard of the global batch a replica trains on
            (the replica's global ordinal; mutants may break this).
        mutant: True for the deliberately broken implementations.
        sync_batchnorm: ``f(module, ctx) -> module`` converting BatchNorm layers to
            the implementation's SyncBatchNorm (``None``: it has none).
        make_optimizer: ``f(params, run) -> torch.optim.Optimizer`` (``run`` a
            ``RunSpec``: ``lr``, ``momentum``); ``None``: plain SGD.
        optimizer_state_dict: ``f(optimizer, ctx) -> dict``, the full (unsharded)
            ``state_dict()`` on every replica, read for checkpoints and the
            optimizer_state check; may run collectives. ``None``: ``state_dict()``.
        forward_backward: ``f(model, inputs, loss_fn) -> loss`` running forward,
            ``loss_fn(output)`` and backward as one step (compiled steps);
            ``None``: the harness calls them in turn.
        unsupported_features: kit feature name (a DDP keyword or ``no_sync``,
            ``join``, ``register_comm_hook``) -> why the implementation lacks it.
        holds_copies: every replica holds full parameter copies (``False`` for
            sharded parameters, which the kit reads via ``DTensor.full_tensor()``).
    """

    name: str
    description: str
    wrap: Callable
    after_backward: Callable | None = None
    unsupported: dict = field(default_factory=dict)
    shard_rank: Callable = _replica_rank
    mutant: bool = False
    sync_batchnorm: Callable | None = None
    make_optimizer: Callable | None = None
    optimizer_state_dict: Callable | None = None
    forward_backward: Callable | None = None
    unsupported_features: dict = field(default_factory=dict)
    holds_copies: bool = True


# Upstream torch.nn.parallel.DistributedDataParallel over the ``xla`` process
# group, in the PJRT topology the kit runs (1 process x W replica threads).
# Measured on torch 2.9.0 + torch_xla 2.9.0 by conformance/tests/test_pjrt_runtime.py
# (test_torch_ddp_on_pjrt_*), which keeps this text honest.
TORCH_DDP_ON_PJRT = (
    "unsupported topology: DDP() raises IndexError: list index out of range in "
    "ProcessGroupXla.allgather (_verify_param_shape_across_processes): with 1 process x W replica "
    "threads the process-global xla group (ddp_impl.xla.init_pjrt_process_group) has 1 rank while "
    "xm.all_gather returns W rows; initialised per thread with xla:// instead, the constructor's "
    "all-gathers compile per thread and XLA aborts the host (Termination timeout for all gather, "
    "1 of W arrived)")


def _wrap_torch(module, ctx, kwargs):
    import torch.nn.parallel
    return torch.nn.parallel.DistributedDataParallel(module, **kwargs)


def _wrap_ref(module, ctx, kwargs):
    import ddp_impl
    return ddp_impl.DistributedDataParallel(module, collectives=ctx.collectives, **kwargs)


def _torch_sync_bn(module, ctx):
    import torch
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)


def _ref_sync_bn(module, ctx):
    from ddp_impl.sync_batchnorm import SyncBatchNorm
    return SyncBatchNorm.convert_sync_batchnorm(module, ctx.collectives)


# --- torch_xla's own data-parallel recipe (PJRT only) ------------------------
# No wrapper module: the model itself is returned. Keywords the recipe has no
# counterpart for are reported in ``ignored_kwargs`` (read by the harness's
# unsupported_reason, so a feature that needs one comes out "unsupported").
XLA_RECIPE_KWARGS = frozenset({"broadcast_buffers"})


def _xla_broadcast(tensors):
    """``xm.collective_broadcast`` from replica 0 - the body of
    ``xm.broadcast_master_param`` without its trailing ``torch_xla.sync()``,
    which can deadlock with replica threads (PJRT_CPU_NOTES.md, cause 3); the
    harness runs ``ctx.mark_step()`` after construction instead. It multiplies
    by a 1/0 *device* scalar and all-reduces (layout pinned, as
    ``xm.reduce_gradients``), so every replica's graph is the same."""
    import torch_xla.core.xla_model as xm
    if tensors:
        xm.collective_broadcast(list(tensors), root_ordinal=0)


def _wrap_xla_recipe(module, ctx, kwargs):
    broadcast_buffers = kwargs.get("broadcast_buffers", True)
    _xla_broadcast(list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []))
    if broadcast_buffers and any(True for _ in module.buffers()):
        # Upstream DDP's buffer semantics (rank 0's buffers before every synced
        # forward); the bare recipe broadcasts buffers only at the start, and
        # fails buffer_parity from step 2 (measured: batchnorm, W=2, max dev 0.076).
        def sync_buffers(mod, args):
            import torch
            if torch.is_grad_enabled():
                _xla_broadcast(list(mod.buffers()))
        module.register_forward_pre_hook(sync_buffers)
    module.ignored_kwargs = {k: v for k, v in kwargs.items() if k not in XLA_RECIPE_KWARGS}
    return module


def _xla_recipe_after_backward(model, optimizer, ctx):
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    # reduce_gradients scales by 1 / xr.world_size(), a process-wide cache that
    # reads 1 if it was first filled before replication was set up: refuse then.
    if xr.world_size() != ctx.world_size:
        raise RuntimeError(f"torch_xla.runtime.world_size() is {xr.world_size()}, the world has "
                           f"{ctx.world_size} replicas: xm.reduce_gradients would not average")
    xm.reduce_gradients(optimizer)  # all_reduce(SUM, grads, scale=1/W, pin_layout=True)


def _user_wrapper(cls):
    def wrap(module, ctx, kwargs):
        return cls(module, **kwargs)
    return wrap


IMPLS = {i.name: i for i in [
    Impl("torch", "torch.nn.parallel.DistributedDataParallel", _wrap_torch,
         sync_batchnorm=_torch_sync_bn, unsupported={"pjrt": TORCH_DDP_ON_PJRT}),
    Impl("ref", "ddp_impl.DistributedDataParallel (per-parameter all-reduce hooks)", _wrap_ref,
         sync_batchnorm=_ref_sync_bn),
    Impl("xla_recipe", "torch_xla's data-parallel recipe: no wrapper, parameters (and buffers) "
         "broadcast from replica 0, xm.reduce_gradients(optimizer) before optimizer.step()",
         _wrap_xla_recipe, after_backward=_xla_recipe_after_backward,
         unsupported={"cpu": "needs the XLA runtime (torch_xla: xm.collective_broadcast, "
                             "xm.reduce_gradients); run it with --runtime pjrt"}),
]}


def register(impl: Impl) -> None:
    """Add ``impl`` to the table (runtime adapters register their own rows)."""
    IMPLS[impl.name] = impl


def resolve_impl(spec: str) -> Impl:
    """Return the :class:`Impl` for ``spec``.

    Raises:
        ImplSpecError: unknown name, unknown mutant, a module that does not
            import, or an attribute that is missing or not callable.
    """
    spec = spec.strip()
    if spec.startswith("mutant:"):
        from .mutants import mutant_impl
        return mutant_impl(spec[len("mutant:"):])
    if spec in IMPLS:
        return IMPLS[spec]
    if ":" not in spec:
        raise ImplSpecError(f"unknown DDP implementation {spec!r}; use one of "
                            f"{', '.join(IMPLS)}, mutant:<name> or package.module:Class")
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # any import-time error is the user's spec failing
        raise ImplSpecError(f"--ddp {spec!r}: cannot import {mod_name!r}: "
                            f"{type(exc).__name__}: {exc}") from None
    cls = getattr(mod, attr, None)
    if not callable(cls):
        raise ImplSpecError(f"--ddp {spec!r}: module {mod_name!r} has no callable {attr!r}")
    return Impl(spec, f"user implementation {spec}", _user_wrapper(cls))


def parse_impls(specs: str) -> list[Impl]:
    """Resolve a comma-separated list of specs (see :func:`resolve_impl`)."""
    names = [s for s in (p.strip() for p in specs.split(",")) if s]
    if not names:
        raise ImplSpecError("--ddp is empty; name at least one implementation")
    return [resolve_impl(n) for n in names]


from . import targets  # noqa: E402,F401  (registers PyTorch's shipped data-parallel rows)
