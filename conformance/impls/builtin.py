"""The table of DDP implementations under test, and ``--ddp`` spec resolution.

A spec is a table key (``torch``, ``ref``, ...), ``mutant:<name>`` (see
:mod:`conformance.impls.mutants.catalog`), or ``package.module:Class`` for a user's own DDP.
A user class is constructed like ``torch.nn.parallel.DistributedDataParallel``:
``Class(module, **ddp_kwargs)`` inside a replica whose torch.distributed default
group (CPU runtime) or XLA runtime (PJRT) is initialised.
"""
from __future__ import annotations

import importlib


from conformance.impls.row import Impl, ImplSpecError, refuse_keywords, torch_sync_bn, wrap_torch_ddp
from conformance.impls.mutants.catalog import MUTANTS
from conformance.impls.torch_paths import shipped_rows
from conformance.impls.xla_paths import xla_shipped_rows
from ddp_impl.ddp import IGNORED_TORCH_DDP_KWARGS
from ddp_impl.sync_batchnorm import SyncBatchNorm
import ddp_impl

# Upstream torch.nn.parallel.DistributedDataParallel over the ``xla`` process
# group, in the PJRT topology the kit runs (1 process x W replica threads).
# Measured on torch 2.9.0 + torch_xla 2.9.0 by tests/test_pjrt_runtime.py
# (test_torch_ddp_on_pjrt_*), which keeps this text honest.
TORCH_DDP_ON_PJRT = (
    "unsupported topology: DDP() raises IndexError: list index out of range in "
    "ProcessGroupXla.allgather (_verify_param_shape_across_processes): with 1 process x W replica "
    "threads the process-global xla group (ddp_impl.runtime.xla.init_pjrt_process_group) has 1 rank while "
    "xm.all_gather returns W rows; initialised per thread with xla:// instead, the constructor's "
    "all-gathers compile per thread and XLA aborts the host (Termination timeout for all gather, "
    "1 of W arrived)")


def _wrap_ref(module, ctx, kwargs):
    return ddp_impl.DistributedDataParallel(module, collectives=ctx.collectives, **kwargs)


def _ref_sync_bn(module, ctx):
    return SyncBatchNorm.convert_sync_batchnorm(module, ctx.collectives)


# --- torch_xla's own data-parallel recipe (PJRT only) ------------------------
# No wrapper module: the model itself is returned. A keyword the recipe has no
# counterpart for is refused with TypeError (the constructor contract), which the
# harness reports as unsupported.
XLA_RECIPE_KWARGS = frozenset({"broadcast_buffers"})


def _xla_broadcast(tensors):
    """``xm.collective_broadcast`` from replica 0 - the body of
    ``xm.broadcast_master_param`` without its trailing ``torch_xla.sync()``,
    which can deadlock with replica threads (docs/runtimes/pjrt.md, cause 3); the
    harness runs ``ctx.mark_step()`` after construction instead. It multiplies
    by a 1/0 *device* scalar and all-reduces (layout pinned, as
    ``xm.reduce_gradients``), so every replica's graph is the same."""
    import torch_xla.core.xla_model as xm
    if tensors:
        xm.collective_broadcast(list(tensors), root_ordinal=0)


def _wrap_xla_recipe(module, ctx, kwargs):
    refuse_keywords("xla_recipe", kwargs, XLA_RECIPE_KWARGS)
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


def _ref_ignores() -> frozenset:
    return frozenset(IGNORED_TORCH_DDP_KWARGS)


def _user_wrapper(cls):
    def wrap(module, ctx, kwargs):
        return cls(module, **kwargs)
    return wrap


IMPLS = {i.name: i for i in [
    Impl("torch", "torch.nn.parallel.DistributedDataParallel", wrap_torch_ddp,
         sync_batchnorm=torch_sync_bn, unsupported={"pjrt": TORCH_DDP_ON_PJRT}),
    Impl("ref", "ddp_impl.DistributedDataParallel (the kit's reference DDP)", _wrap_ref,
         sync_batchnorm=_ref_sync_bn, ignores=_ref_ignores()),
    Impl("xla_recipe", "torch_xla's data-parallel recipe: no wrapper, parameters (and buffers) "
         "broadcast from replica 0, xm.reduce_gradients(optimizer) before optimizer.step()",
         _wrap_xla_recipe, after_backward=_xla_recipe_after_backward,
         unsupported={"cpu": "needs the XLA runtime (torch_xla: xm.collective_broadcast, "
                             "xm.reduce_gradients); run it with --runtime pjrt"}),
]}


def _add_shipped_paths():
    for row in shipped_rows() + xla_shipped_rows():
        IMPLS[row.name] = row


_add_shipped_paths()


def resolve_impl(spec: str) -> Impl:
    """Return the :class:`Impl` for ``spec``.

    Raises:
        ImplSpecError: unknown name, unknown mutant, a module that does not
            import, or an attribute that is missing or not callable.
    """
    spec = spec.strip()
    if spec.startswith("mutant:"):
        return mutant_impl(spec[len("mutant:"):])
    if spec in IMPLS:
        return IMPLS[spec]
    if ":" not in spec:
        raise ImplSpecError(f"unknown DDP implementation {spec!r}; use one of "
                            f"{', '.join(IMPLS)}, all, mutant:<name> or package.module:Class")
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


def parse_impls(specs: str, runtime: str | None = None) -> list[Impl]:
    """Resolve a comma-separated list of specs (see :func:`resolve_impl`). ``all`` names
    every row of the table that runs on ``runtime`` (every row when ``runtime`` is None)."""
    names = [s for s in (p.strip() for p in specs.split(",")) if s]
    if "all" in names:
        rows = [n for n, row in IMPLS.items() if runtime is None or runtime not in row.unsupported]
        names = [n for n in names if n != "all"] + [n for n in rows if n not in names]
    if not names:
        raise ImplSpecError("--ddp is empty; name at least one implementation")
    return [resolve_impl(n) for n in names]


def mutant_impl(name: str) -> Impl:
    """The :class:`Impl` row of catalog mutant ``name`` (``conformance.impls.mutants.catalog``).

    Raises:
        ImplSpecError: unknown mutant.
    """
    if name not in MUTANTS:
        raise ImplSpecError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    m = MUTANTS[name]
    if m.shipped_path is not None:  # a shipped path's row (conformance/impls/torch_paths.py) with one fault
        from dataclasses import replace
        return replace(m.shipped_path(), name=f"mutant:{name}", description=m.description, mutant=True)

    def wrap(module, ctx, kwargs):
        cls = m.ddp_class if isinstance(m.ddp_class, type) else m.ddp_class()
        if m.torch_based:
            return cls(module, **kwargs)
        return cls(module, collectives=ctx.collectives, **kwargs)
    extra = {"shard_rank": m.shard_rank} if m.shard_rank else {}
    if m.sync_bn:
        extra["sync_batchnorm"] = lambda module, ctx: m.sync_bn().convert_sync_batchnorm(module, ctx.collectives)
    elif not m.torch_based:
        extra["sync_batchnorm"] = _ref_sync_bn
    if m.torch_based:  # torch.distributed underneath: cannot run where torch's DDP cannot
        extra["unsupported"] = m.unsupported or {"pjrt": TORCH_DDP_ON_PJRT}
    else:
        extra["ignores"] = _ref_ignores() - frozenset(m.honours)
    return Impl(f"mutant:{name}", m.description, wrap, mutant=True, **extra)
