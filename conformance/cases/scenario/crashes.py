"""Replica crashes in generated scenarios: the statement a crash needs, and the space without it.

A scenario is a set of *statements*: one value of each table-driven dimension (the loop's
:data:`~.dimensions.LOOPS`, the module's :data:`~.dimensions.MODULES`, the workload's
:data:`~.dimensions.WORKLOADS`, the drawn DDP keywords :data:`~.generate.KEYWORD_VALUES`).
When a replica raises on a (shrunk) scenario, :func:`culprit` finds a statement whose change to
another value makes the crash go away; the case then draws its scenarios again without that
statement (:attr:`~.generate.Space.exclude`), so a DDP that crashes under one loop statement is
still judged on the others (a DDP that asserts under ``zero_grad(set_to_none=True)`` is still
caught doubling gradients under ``zero_grad(set_to_none=False)``).
"""
from __future__ import annotations

import copy

from conformance.cases.scenario.dimensions import LOOP_PHRASES, LOOPS, MODULE_PHRASES, MODULES, WORKLOAD_PHRASES, WORKLOADS
from conformance.cases.scenario.format import ScenarioError
from conformance.cases.scenario.generate import KEYWORD_VALUES

#: Scenario field -> the table of its drawn dimensions (a statement is ``(field, key, value)``).
STATEMENT_TABLES = {"loop": LOOPS, "module": MODULES, "workload": WORKLOADS, "ddp": KEYWORD_VALUES}
#: The most statements excluded from one case (each costs a new search).
MAX_EXCLUDED = 3
#: The most scenarios one culprit search runs (each changes one statement of the crashing scenario).
MAX_CULPRIT_RUNS = 16


def drawn(space) -> tuple:
    """The scenario fields whose statements ``space`` draws (a case drawing the plain loop cannot
    leave a loop statement out)."""
    return tuple(f for f, on in (("loop", space.loop), ("module", space.loop), ("workload", space.workload),
                                 ("ddp", "keywords" in space.ddp_extra)) if on)


def statements(sc, fields=tuple(STATEMENT_TABLES)) -> list[tuple]:
    """``[(field, key, value)]`` of scenario ``sc``'s dimensions of ``fields``, non-plain values
    first (a crash more often needs what the plain program does not do)."""
    out = [(f, k, getattr(sc, f)[k]) for f in fields for k in STATEMENT_TABLES[f]
           if k in (getattr(sc, f) or {})]
    return sorted(out, key=lambda s: STATEMENT_TABLES[s[0]][s[1]][0] == s[2])


def holds(sc, statement) -> bool:
    """Whether scenario ``sc`` holds ``statement``."""
    f, k, v = statement
    return (getattr(sc, f) or {}).get(k, STATEMENT_TABLES[f][k][0]) == v


def phrase(statement) -> str:
    """``loop zero_grad='set_to_none'`` (with the dimension's words where the tables have them)."""
    f, k, v = statement
    words = (LOOP_PHRASES.get((k, v)) if f == "loop" else MODULE_PHRASES.get(v) if f == "module"
             else WORKLOAD_PHRASES.get(v) if f == "workload" else None)
    return f"{f} {k}={v!r}" + (f" ({words})" if words else "")


def variants(sc, statement):
    """The valid scenarios that differ from ``sc`` in ``statement``'s dimension only."""
    f, k, v = statement
    for other in STATEMENT_TABLES[f][k]:
        if other == v:
            continue
        alt = copy.deepcopy(sc)
        getattr(alt, f)[k] = other
        try:
            alt.validate()
        except ScenarioError:
            continue
        yield alt


def culprit(sc, crashes, fields=tuple(STATEMENT_TABLES), max_runs: int = MAX_CULPRIT_RUNS):
    """The first statement of ``sc``'s ``fields`` (:func:`statements` order) whose change to the
    first other valid value makes ``crashes(scenario) -> bool | None`` false, or None (no statement
    the case draws is needed: the plain program crashes too; ``max_runs`` scenarios were tried; or
    ``crashes`` answered None, the world broke)."""
    runs = 0
    for st in statements(sc, fields):
        alt = next(variants(sc, st), None)
        if alt is None:
            continue
        if runs >= max_runs:
            return None
        runs += 1
        crashed = crashes(alt)
        if crashed is None:  # the world broke: no answer
            return None
        if not crashed:
            return st
    return None


def excluded(sc, space) -> tuple | None:
    """The first statement of ``space.exclude`` scenario ``sc`` holds, or None."""
    return next((st for st in space.exclude if holds(sc, st)), None)
