"""The case table's validation (:func:`validate`) and the kinds it loads (:func:`kinds`).

It sits above every kind: it imports the kind modules :data:`conformance.cases.kinds.REGISTRY`
names and checks each row's kind-specific columns with that kind's ``KIND``
(:class:`conformance.cases.kinds.Kind`); the catalog's own checks of a mutant's claims are
:mod:`conformance.impls.mutants.claims`.
"""
from __future__ import annotations

import importlib

from conformance.cases.kinds import REGISTRY, Kind
from conformance.cases.row import FAMILIES, Case
from conformance.cases.shared.setups import SETUPS
from conformance.impls.mutants.catalog import MUTANTS
from conformance.impls.mutants.claims import cannot_serve, claim_problems, unused_claims
from conformance.tolerances import MIN_WORLD_SIZE, TOLERANCES
from conformance.worlds.runtimes import RUNTIMES

_KINDS: dict[str, Kind] = {}


def kinds() -> dict[str, Kind]:
    """Every kind by name (registry order): the ``KIND`` of each module of
    :data:`~conformance.cases.kinds.REGISTRY`, imported on first call.

    Raises:
        ValueError: a registered module declares no ``KIND`` :class:`Kind`, or one of another name.
    """
    if not _KINDS:
        for name, line in REGISTRY.items():
            kind = getattr(importlib.import_module(line.module), "KIND", None)
            if not isinstance(kind, Kind) or kind.name != name:
                raise ValueError(f"kind registry: {line.module} must declare KIND = Kind({name!r}, ...), "
                                 f"got {kind!r:.80}")
            _KINDS[name] = kind
    return dict(_KINDS)


def validate(rows, mutants: dict | None = None) -> dict[str, Case]:
    """The table of ``rows`` by name, every row checked against the kit's other tables
    (:func:`_row_problem`: names, kinds and their own columns, models, tolerance keys, setups,
    mutants that can serve the row and claim nothing without effect; :func:`_check_catalog`:
    every mutant killed by some row, its claims used).

    ``mutants``: the catalog to check against (default: ``conformance.impls.mutants.catalog.MUTANTS``).
    Imports the kinds, the models and every reference a row or mutant names (torch).

    Raises:
        ValueError: ``case table: row '<name>': <why>`` (or naming the mutant no row kills).
    """
    from fixtures.models import MODELS
    if mutants is None:
        mutants = MUTANTS
    known = kinds()
    table: dict[str, Case] = {}
    for c in rows:
        why = "duplicate name" if c.name in table else _row_problem(c, known, mutants, MODELS)
        if why:
            raise ValueError(f"case table: row {c.name!r}: {why}")
        table[c.name] = c
    _check_catalog(rows, mutants, known)
    return table


def _row_problem(c: Case, known: dict, mutants: dict, models) -> str | None:
    """The first thing wrong with row ``c`` (:func:`validate`), or None; fills in the checks a
    row's kind derives. A mutant the row must kill has to serve it (honour the keywords, have
    the methods it requires: else the case is ``unsupported`` for it and it survives) and claim
    nothing that has no effect (:func:`conformance.impls.mutants.claims.claim_problems`)."""
    keys = {t.dtype for t in TOLERANCES} | {"grad"}
    if c.family not in FAMILIES or not c.name.startswith(c.family + "."):
        return f"family {c.family!r} must be one of {FAMILIES} and prefix the name"
    if c.kind not in known:
        return f"unknown kind {c.kind!r}"
    kind = known[c.kind]
    if c.model not in ("-", "scenario") and c.model not in models:
        return f"unknown model {c.model!r}"
    if c.tolerance not in keys:
        return f"unknown tolerance key {c.tolerance!r}; known: {', '.join(sorted(keys))}"
    unknown = [m for m in c.must_kill if m not in mutants]
    if unknown:
        return f"unknown mutant(s) {unknown}"
    unknown = [s for s in c.train.get("setups", ()) if s not in SETUPS]
    if unknown:
        return f"unknown setup(s) {unknown}"
    if kind.checks:
        object.__setattr__(c, "checks", tuple(kind.checks(c)))
    why = kind.validate(c)
    if why:
        return why
    if not c.checks:
        return "no checks"
    for rt, sizes in c.world_sizes.items():
        if rt not in RUNTIMES or not sizes or not all(isinstance(w, int) and w >= MIN_WORLD_SIZE for w in sizes):
            return (f"world_sizes {rt!r}: {sizes!r}: need a runtime ({', '.join(RUNTIMES)}) and "
                    f"world sizes >= {MIN_WORLD_SIZE}")
    for m in c.must_kill:
        why = claim_problems(mutants[m]) or cannot_serve(mutants[m], tuple(kind.requires(c)))
        if why:
            return f"mutant {m!r} {why}"
    return None


def _check_catalog(rows, mutants: dict, known: dict) -> None:
    """Every mutant is killed by some row and each of its claims is used by one (:func:`validate`).

    Raises:
        ValueError: naming the mutant (and the rows that must kill it).
    """
    orphans = sorted(set(mutants) - {m for c in rows for m in c.must_kill})
    if orphans:
        raise ValueError(f"case table: mutant(s) {orphans} are killed by no case (add them to a row's must_kill)")
    for name, m in mutants.items():
        killers = [c for c in rows if name in c.must_kill]
        unused = unused_claims(m, {k for c in killers for k in (*known[c.kind].requires(c), *known[c.kind].uses(c))})
        if unused:
            raise ValueError(f"case table: row(s) {[c.name for c in killers]}: mutant {name!r} claims {unused}, "
                             "which no row that must kill it uses (drop the claim or add a row that needs it)")
