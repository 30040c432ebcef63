"""Mutant self-test: run every mutant through every check on every model."""
from __future__ import annotations

from fixtures.models import PARITY_MODELS

from .mutants import PARITY_MUTANTS


def mutant_verdicts(runner, runtime: str, world_size: int, mutant: str, models=None) -> list:
    """All verdicts of ``mutant:<mutant>`` over ``models`` (default: every model)."""
    out = []
    for model in models or list(PARITY_MODELS):
        out += list(runner.verdicts(runtime, world_size, f"mutant:{mutant}", model).values())
    return out


def kill_rows(runner, runtime: str, world_size: int, mutants=None, models=None) -> list[tuple]:
    """``[(runtime, world_size, mutant, verdicts)]`` for the kill matrix."""
    return [(runtime, world_size, m, mutant_verdicts(runner, runtime, world_size, m, models))
            for m in (mutants or list(PARITY_MUTANTS))]
