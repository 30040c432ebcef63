"""The mutant catalog: deliberately broken DDPs every check table must kill.

Each mutant is the reference DDP (:class:`ddp_impl.DistributedDataParallel`)
with one seam broken, or a correct DDP fed the wrong shard. Operators follow
real data-parallel bugs (cf. DeepCrime's catalogue of DL faults). ``killed_by``
names the checks expected to catch it; the self-test requires at least one check
to fail (not merely turn vacuous) on at least one model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ddp_impl import DistributedDataParallel as RefDDP

from .impls import Impl, ImplSpecError


class NoGradSync(RefDDP):
    """Gradients are never all-reduced: every replica trains on its shard alone."""

    def _reduce_grad(self, param):
        pass


class SumNotMean(RefDDP):
    """All-reduce sums gradients but never divides by the world size."""

    def _grad_scale(self):
        return 1.0


class WrongCount(RefDDP):
    """Mean over the wrong count: divides by world_size + 1 (off by one)."""

    def _grad_scale(self):
        return 1.0 / (self.collectives.world_size + 1)


class ScaleTwice(RefDDP):
    """The 1/world_size scale is applied twice (1/world_size**2)."""

    def _grad_scale(self):
        return 1.0 / self.collectives.world_size ** 2


class NoInitialBroadcast(RefDDP):
    """Module states are not broadcast at construction (replicas start apart)."""

    def _sync_module_states(self):
        pass


class BuffersNotBroadcast(RefDDP):
    """``broadcast_buffers=True`` is accepted but buffers are never broadcast."""

    def _sync_buffers(self):
        pass


class LastParamUnsynced(RefDDP):
    """Every parameter's gradient is synced except the last one's."""

    def _reduce_grad(self, param):
        if param is not list(self.module.parameters())[-1]:
            super()._reduce_grad(param)


class StaleGradient(RefDDP):
    """The step applies the previous step's synced gradient (zero at step 1)."""

    @torch.no_grad()
    def _reduce_grad(self, param):
        super()._reduce_grad(param)
        fresh = param.grad.clone()
        stale = getattr(param, "_stale_grad", None)
        param.grad.copy_(stale if stale is not None else torch.zeros_like(fresh))
        param._stale_grad = fresh


def _shard_zero(ctx):
    return 0


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    ddp_class: type
    killed_by: tuple
    shard_rank: object = None


MUTANTS = {m.name: m for m in [
    Mutant("no_grad_sync", NoGradSync.__doc__, NoGradSync, ("param_parity", "loss_parity")),
    Mutant("sum_not_mean", SumNotMean.__doc__, SumNotMean, ("param_parity",)),
    Mutant("wrong_count", WrongCount.__doc__, WrongCount, ("param_parity",)),
    Mutant("no_initial_broadcast", NoInitialBroadcast.__doc__, NoInitialBroadcast,
           ("param_parity", "loss_parity")),
    Mutant("buffers_not_broadcast", BuffersNotBroadcast.__doc__, BuffersNotBroadcast,
           ("buffer_parity",)),
    Mutant("last_param_unsynced", LastParamUnsynced.__doc__, LastParamUnsynced, ("param_parity",)),
    Mutant("scale_twice", ScaleTwice.__doc__, ScaleTwice, ("param_parity",)),
    Mutant("stale_gradient", StaleGradient.__doc__, StaleGradient, ("param_parity", "loss_parity")),
    Mutant("shard_mixup", "Correct DDP, but every replica trains on shard 0 (rank binding "
           "returns 0).", RefDDP, ("param_parity", "loss_parity"), shard_rank=_shard_zero),
]}


def mutant_impl(name: str) -> Impl:
    """The :class:`~conformance.impls.Impl` row of mutant ``name``.

    Raises:
        ImplSpecError: unknown mutant.
    """
    if name not in MUTANTS:
        raise ImplSpecError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    m = MUTANTS[name]

    def wrap(module, ctx, kwargs):
        return m.ddp_class(module, collectives=ctx.collectives, **kwargs)
    extra = {"shard_rank": m.shard_rank} if m.shard_rank else {}
    return Impl(f"mutant:{name}", m.description, wrap, mutant=True, **extra)
