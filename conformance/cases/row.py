"""The row type of the case table (:mod:`conformance.cases.table`), its validation and
tag selection.

One row (in the spirit of PyTorch's OpInfo) per case: parity on a model, a DDP
feature, a Hypothesis property, a rank invariant, generated scenarios. A row says
how it is evaluated (``kind``; each kind's evaluator lives with the kind and
:func:`conformance.evaluate.evaluate` dispatches to it):

* ``train`` - the standard training loop (:mod:`conformance.cases.train`)
  with the row's run overrides and setups (``run``), judged against the
  single-device reference by the check table and by replica agreement;
* ``task`` - the row's own replica task and judge (``task``, ``judge``;
  :mod:`conformance.cases.features`);
* ``property`` - a Hypothesis property (:mod:`conformance.cases.properties.run`);
* ``invariant`` - the rank-binding invariants of the world (:mod:`conformance.cases.ranks`);
* ``scenario`` - generated training scenarios (:mod:`conformance.cases.scenarios.scenario`):
  explicit ones, then Hypothesis-drawn ones, against the DDP-semantics oracle.

``must_kill`` names the catalog mutants the case must fail: the only place the
mutant <-> case relation is stored. :func:`_validate` checks the rows when the
table is built and raises ``ValueError`` naming the row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

#: Case families (also tags).
FAMILIES = ("parity", "feature", "property", "invariant", "scenario")
KINDS = ("train", "task", "property", "invariant", "scenario")


@dataclass(frozen=True)
class Case:
    """One row of the case table.

    Attributes:
        name: unique id, ``<family>.<name>`` (e.g. ``feature.no_sync``).
        family: one of :data:`FAMILIES`.
        description: what a conforming DDP does, one sentence.
        kind: how it is evaluated (see the module docstring).
        model: the model (``fixtures.models.MODELS``) or ``"-"``.
        tolerance: the tolerance key: a dtype row of ``conformance.tolerances``
            (``float32``, ``bf16-autocast``, ``exact``) or ``grad`` (the
            gradient tolerances of the properties).
        run: for ``train``: RunSpec overrides (``setups``, ``ddp_kwargs``,
            ``requires``, ``momentum``, ``broadcast_buffers``...).
        task / judge: for ``task``: ``task(ctx, impl, **args) -> dict`` on every
            replica, ``judge(results, impl, runtime) -> list[Verdict]``.
        args: keyword arguments of ``task``.
        prop: for ``property``: the property name.
        checks: the check names the case reports (one verdict each, whatever
            the outcome, so verdict ids are stable).
        tags: extra selection tags (feature names); the family, the model and
            the name are tags too (see :attr:`all_tags`).
        must_kill: catalog mutants this case must fail.
        skips: ``{runtime | impl | "runtime/impl": reason}``: where the case
            cannot run, with the reason (a ``skip`` verdict).
        timeout: bound on one world task in seconds (``None``: the world's).
    """

    name: str
    family: str
    description: str
    kind: str
    model: str = "-"
    tolerance: str = "float32"
    run: dict = field(default_factory=dict)
    task: Callable | None = None
    judge: Callable | None = None
    args: dict = field(default_factory=dict)
    prop: str = ""
    checks: tuple = ()
    tags: tuple = ()
    must_kill: tuple = ()
    skips: dict = field(default_factory=dict)
    timeout: float | None = None

    @property
    def all_tags(self) -> frozenset:
        return frozenset((self.name, self.family, self.model, self.name.split(".", 1)[-1]) + tuple(self.tags)) - {"-"}

    def skip_reason(self, runtime: str, impl: str) -> str | None:
        for key in (f"{runtime}/{impl}", impl, runtime):
            if key in self.skips:
                return self.skips[key]
        return None


def _validate(rows: list[Case]) -> dict[str, Case]:
    from fixtures.models import MODELS

    from conformance.impls.mutants.catalog import MUTANTS
    from conformance.cases.train.evaluate import train_checks
    from conformance.cases.train.setups import SETUPS
    from conformance.tolerances import TOLERANCES
    keys = {t.dtype for t in TOLERANCES} | {"grad"}
    table: dict[str, Case] = {}
    for c in rows:
        def bad(why):
            return ValueError(f"case table: row {c.name!r}: {why}")
        if c.name in table:
            raise bad("duplicate name")
        if c.family not in FAMILIES or not c.name.startswith(c.family + "."):
            raise bad(f"family {c.family!r} must be one of {FAMILIES} and prefix the name")
        if c.kind not in KINDS:
            raise bad(f"unknown kind {c.kind!r}")
        if c.model not in ("-", "scenario") and c.model not in MODELS:
            raise bad(f"unknown model {c.model!r}")
        if c.tolerance not in keys:
            raise bad(f"unknown tolerance key {c.tolerance!r}; known: {', '.join(sorted(keys))}")
        unknown = [m for m in c.must_kill if m not in MUTANTS]
        if unknown:
            raise bad(f"unknown mutant(s) {unknown}")
        unknown = [s for s in c.run.get("setups", ()) if s not in SETUPS]
        if unknown:
            raise bad(f"unknown setup(s) {unknown}")
        if c.kind == "train":
            object.__setattr__(c, "checks", train_checks(c.model, c.run))
        elif c.kind == "task" and (c.task is None or c.judge is None):
            raise bad("a task case needs task and judge")
        if not c.checks:
            raise bad("no checks")
        table[c.name] = c
    orphans = sorted(set(MUTANTS) - {m for c in rows for m in c.must_kill})
    if orphans:
        raise ValueError(f"case table: mutant(s) {orphans} are killed by no case (add them to a row's must_kill)")
    return table


def tags_of(cases) -> frozenset:
    """Every tag that selects one of ``cases``."""
    return frozenset().union(*(c.all_tags for c in cases))


def select_rows(cases, only=(), skip=()) -> list[Case]:
    """The rows of ``cases`` carrying a tag of ``only`` (all rows if empty) and none of ``skip``.

    Raises:
        UsageError: a tag that selects nothing (the message lists the families).
    """
    from conformance.errors import UsageError
    cases = list(cases)
    known = tags_of(cases)
    for opt, tags in (("--only", only), ("--skip", skip)):
        unknown = [t for t in tags if t not in known]
        if unknown:
            raise UsageError(f"{opt}: unknown tag(s) {', '.join(unknown)}; use a family "
                             f"({', '.join(FAMILIES)}), a model, a feature or a case name")
    return [c for c in cases if (not only or c.all_tags & set(only)) and not (c.all_tags & set(skip))]
