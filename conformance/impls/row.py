"""The implementation row type (a leaf module: ``impls.builtin``, ``impls.torch_paths`` and ``impls.mutants``
import it, it imports none of them), and the two torch helpers rows share."""
from __future__ import annotations

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
        ignores: DDP keywords the implementation accepts but does not honour
            (a case requiring one is ``unsupported``).
        make_optimizer: ``f(params, run) -> torch.optim.Optimizer`` (``run`` a
            ``RunSpec``: ``lr``, ``momentum``); ``None``: plain SGD.
        optimizer_state_dict: ``f(optimizer, ctx) -> dict``, the full (unsharded)
            ``state_dict()`` on every replica, read for checkpoints and the
            optimizer_state check; may run collectives. ``None``: ``state_dict()``.
        forward_backward: ``f(model, inputs, loss_fn) -> loss`` running forward,
            ``loss_fn(output)`` and backward as one step (compiled steps);
            ``None``: the loop calls them in turn.
        unsupported_features: DDP keyword or method (``no_sync``, ``join``,
            ``register_comm_hook``) -> why the implementation lacks it.
        holds_copies: every replica holds full parameter copies (``False`` for
            sharded parameters, which the kit reads via ``DTensor.full_tensor()``).
        no_copies_reason: why replica agreement is not checked when
            ``holds_copies`` is ``False`` (the agreement verdict's reason).
        topology: runtime name -> the topology its worlds use for this row
            (:data:`conformance.worlds.runtimes.TOPOLOGIES`, e.g. ``"spmd"``: one
            program over a W-device mesh instead of W replicas).
        unsupported_kinds: case kind (``task``, ``property``, ``scenario``) ->
            why the row cannot run cases of that kind.
    """

    name: str
    description: str
    wrap: Callable
    after_backward: Callable | None = None
    unsupported: dict = field(default_factory=dict)
    shard_rank: Callable = _replica_rank
    mutant: bool = False
    sync_batchnorm: Callable | None = None
    ignores: frozenset = frozenset()
    make_optimizer: Callable | None = None
    optimizer_state_dict: Callable | None = None
    forward_backward: Callable | None = None
    unsupported_features: dict = field(default_factory=dict)
    holds_copies: bool = True
    no_copies_reason: str = ("shards parameters over replicas (no copies to agree); the kit reads "
                             "gathered full tensors")
    topology: dict = field(default_factory=dict)
    unsupported_kinds: dict = field(default_factory=dict)


def refuse_keywords(row: str, kwargs: dict, accepted) -> None:
    """The constructor contract for rows without DDP's full signature: a keyword
    outside ``accepted`` raises ``TypeError`` (the harness reports the case unsupported)."""
    other = sorted(k for k in kwargs if k not in accepted)
    if other:
        raise TypeError(f"{row} has no counterpart for keyword(s) {', '.join(other)}")


def wrap_torch_ddp(module, ctx, kwargs):
    """``torch.nn.parallel.DistributedDataParallel(module, **kwargs)``."""
    import torch.nn.parallel
    return torch.nn.parallel.DistributedDataParallel(module, **kwargs)


def torch_sync_bn(module, ctx):
    """``torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)``."""
    import torch
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
