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
    """

    name: str
    description: str
    wrap: Callable
    after_backward: Callable | None = None
    unsupported: dict = field(default_factory=dict)
    shard_rank: Callable = _replica_rank
    mutant: bool = False
    sync_batchnorm: Callable | None = None


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


def _user_wrapper(cls):
    def wrap(module, ctx, kwargs):
        return cls(module, **kwargs)
    return wrap


IMPLS = {i.name: i for i in [
    Impl("torch", "torch.nn.parallel.DistributedDataParallel", _wrap_torch,
         sync_batchnorm=_torch_sync_bn),
    Impl("ref", "ddp_impl.DistributedDataParallel (per-parameter all-reduce hooks)", _wrap_ref,
         sync_batchnorm=_ref_sync_bn),
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
