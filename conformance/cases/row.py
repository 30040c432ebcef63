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
  explicit ones, then Hypothesis-drawn ones, against the DDP-semantics oracle;
* ``collective`` - one torch.distributed collective (``args["op"]``, a key of
  :data:`conformance.cases.collectives.ops.OPS`) on the world's backend against its host
  oracle (:mod:`conformance.cases.collectives.run`); no DDP is involved.

``must_kill`` names the catalog mutants the case must fail: the only place the
mutant <-> case relation is stored. :func:`_validate` checks the rows when the
table is built and raises ``ValueError`` naming the row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable
from conformance.cases.train.setups import SETUPS
from conformance.errors import UsageError
from conformance.tolerances import MIN_WORLD_SIZE, TOLERANCES
from conformance.worlds.runtimes import RUNTIMES

#: Case families (also tags).
FAMILIES = ("parity", "feature", "property", "invariant", "scenario", "collective")
KINDS = ("train", "task", "property", "invariant", "scenario", "collective")


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
        train: for ``train``: RunSpec overrides (``setups``, ``ddp_kwargs``,
            ``requires``, ``momentum``, ``broadcast_buffers``...).
        task / judge: for ``task``: ``task(ctx, impl, **args) -> dict`` on every
            replica, ``judge(results, impl, runtime) -> list[Verdict]``.
        args: for ``task``: keyword arguments of ``task``; for ``scenario``:
            ``{"space": {...}}``, the fields of the scenarios' ``Space``.
        prop: for ``property``: the property name (a key of the property kind's
            ``PROPERTIES``).
        checks: the check names the case reports (one verdict each, whatever
            the outcome, so verdict ids are stable).
        tags: extra selection tags (feature names); the family, the model and
            the name are tags too (see :attr:`all_tags`).
        must_kill: catalog mutants this case must fail.
        timeout: bound on one world task in seconds (``None``: the world's).
        world_sizes: ``{runtime: (W, ...)}``: the world sizes the case runs at when none
            are given (``--world-size`` absent), instead of the runtime's defaults
            (``conformance.settings.DEFAULT_WORLD_SIZES``); e.g. two groups of two need W=4.
    """

    name: str
    family: str
    description: str
    kind: str
    model: str = "-"
    tolerance: str = "float32"
    train: dict = field(default_factory=dict)
    task: Callable | None = None
    judge: Callable | None = None
    args: dict = field(default_factory=dict)
    prop: str = ""
    checks: tuple = ()
    tags: tuple = ()
    must_kill: tuple = ()
    timeout: float | None = None
    world_sizes: dict = field(default_factory=dict)

    @property
    def all_tags(self) -> frozenset:
        return frozenset((self.name, self.family, self.model, self.name.split(".", 1)[-1]) + tuple(self.tags)) - {"-"}


def _validate(rows: list[Case], mutants: dict | None = None) -> dict[str, Case]:
    """The table of ``rows`` by name, every row checked against the kit's other tables.

    A row's name is unique and prefixed by its family; its kind, model, tolerance key,
    setups and mutants are known; a ``train`` row gets its checks from the check
    table; a ``task`` row has a task and a judge; a ``property`` row names a property
    of the property kind; a ``scenario`` row's space is one the scenarios are drawn
    from; every mutant a row must kill can serve the row (it honours the keywords and
    has the methods the row requires: else the case is ``unsupported`` for it and it
    survives) and claims nothing that has no effect (see :func:`_claim_problems`);
    every mutant is killed by some row and uses its claims in one.

    ``mutants``: the catalog to check against (default: ``conformance.impls.mutants.catalog.MUTANTS``).

    Raises:
        ValueError: ``case table: row '<name>': <why>`` (or naming the mutant no row kills).
    """
    from fixtures.models import MODELS

    from conformance.cases.properties.run import PROPERTIES
    from conformance.cases.scenarios.scenario import space_problem
    from conformance.cases.train.evaluate import train_checks
    if mutants is None:
        from conformance.impls.mutants.catalog import MUTANTS as mutants
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
        unknown = [m for m in c.must_kill if m not in mutants]
        if unknown:
            raise bad(f"unknown mutant(s) {unknown}")
        unknown = [s for s in c.train.get("setups", ()) if s not in SETUPS]
        if unknown:
            raise bad(f"unknown setup(s) {unknown}")
        if c.kind == "train":
            object.__setattr__(c, "checks", train_checks(c.model, c.train))
        elif c.kind == "task" and (c.task is None or c.judge is None):
            raise bad("a task case needs task and judge")
        elif c.kind == "property" and c.prop not in PROPERTIES:
            raise bad(f"unknown property {c.prop!r}; known: {', '.join(PROPERTIES)}")
        elif c.kind == "collective":
            from conformance.cases.collectives.ops import OPS
            if c.args.get("op") not in OPS:
                raise bad(f"unknown collective op {c.args.get('op')!r}; known: {', '.join(OPS)}")
            want = ("result", "agreement", "coverage") if OPS[c.args["op"]].agree else ("result", "coverage")
            if tuple(c.checks) != want:
                raise bad(f"a collective row of {c.args['op']} reports the checks {want}")
        elif c.kind == "scenario":
            why = space_problem(c.args.get("space", {}))
            if why:
                raise bad(f"scenario space: {why}")
        if not c.checks:
            raise bad("no checks")
        for rt, sizes in c.world_sizes.items():
            if rt not in RUNTIMES or not sizes or not all(isinstance(w, int) and w >= MIN_WORLD_SIZE for w in sizes):
                raise bad(f"world_sizes {rt!r}: {sizes!r}: need a runtime ({', '.join(RUNTIMES)}) and "
                          f"world sizes >= {MIN_WORLD_SIZE}")
        for m in c.must_kill:
            why = _claim_problems(mutants[m]) or _cannot_serve(mutants[m], _requires(c, SETUPS))
            if why:
                raise bad(f"mutant {m!r} {why}")
        table[c.name] = c
    orphans = sorted(set(mutants) - {m for c in rows for m in c.must_kill})
    if orphans:
        raise ValueError(f"case table: mutant(s) {orphans} are killed by no case (add them to a row's must_kill)")
    for name, m in mutants.items():
        killers = [c for c in rows if name in c.must_kill]
        unused = [k for k in m.honours if not any(k in _requires(c, SETUPS) for c in killers)]
        if m.sync_bn and not any(SETUPS[s].reference.get("sync_bn") for c in killers
                                 for s in c.train.get("setups", ())):
            unused.append("sync_bn")
        if unused:
            raise ValueError(f"case table: row(s) {[c.name for c in killers]}: mutant {name!r} claims {unused}, "
                             "which no row that must kill it uses (drop the claim or add a row that needs it)")
    return table


def _requires(c: Case, setups: dict) -> tuple:
    """The DDP keywords and methods row ``c`` needs an implementation to honour."""
    if c.kind == "train":
        return tuple(c.train.get("requires", ())) + tuple(r for s in c.train.get("setups", ()) for r in setups[s].requires)
    if c.kind == "scenario":
        from conformance.cases.scenarios.scenario import space_requires
        return space_requires(c.args.get("space", {}))
    return ()


def _ref_ignores() -> frozenset:
    from ddp_impl.ddp import IGNORED_TORCH_DDP_KWARGS
    return frozenset(IGNORED_TORCH_DDP_KWARGS)


def _claim_problems(m) -> str | None:
    """What mutant ``m`` (a catalog row) claims that has no effect where
    ``conformance.impls.builtin.mutant_impl`` builds it, or None."""
    if m.shipped_path is not None:
        moot = [f for f in ("ddp_class", "shard_rank", "sync_bn", "honours", "unsupported") if getattr(m, f)]
        if moot or m.torch_based:
            return f"builds a shipped path's row, so its {moot + ['torch_based'] * m.torch_based} have no effect"
        return None
    if m.torch_based and m.honours:
        return f"is torch-based (torch's DDP honours every keyword): honours {list(m.honours)} has no effect"
    if not m.torch_based and m.unsupported:
        return "subclasses the reference DDP, which runs everywhere: its unsupported runtimes have no effect"
    unknown = [r for r in (m.unsupported or {}) if r not in RUNTIMES]
    if unknown:
        return f"is unsupported on unknown runtime(s) {unknown}; known: {', '.join(RUNTIMES)}"
    stale = [k for k in m.honours if k not in _ref_ignores()]
    if stale:
        return f"claims to honour {stale}, which the reference DDP does not ignore: the claim changes nothing"
    return None


def _cannot_serve(m, needs: tuple) -> str | None:
    """Why mutant ``m`` cannot serve a row needing ``needs`` (the row would be ``unsupported``
    for it, never a kill), or None. Mutants of shipped paths are not checked."""
    from conformance.cases.train.loop import DDP_METHODS
    if m.shipped_path is not None:
        return None
    ignored = [k for k in needs if k not in DDP_METHODS and not m.torch_based
               and k in _ref_ignores() - frozenset(m.honours)]
    if ignored:
        return f"ignores keyword(s) {ignored} the row requires: it would be unsupported there, never killed"
    methods = [k for k in needs if k in DDP_METHODS]
    if methods:
        cls = m.ddp_class if isinstance(m.ddp_class, type) else m.ddp_class()
        missing = [k for k in methods if not callable(getattr(cls, k, None))]
        if missing:
            return f"has no {', '.join(k + '()' for k in missing)}, which the row requires: it would be " \
                   "unsupported there, never killed"
    return None


def tags_of(cases) -> frozenset:
    """Every tag that selects one of ``cases``."""
    return frozenset().union(*(c.all_tags for c in cases))


def unknown_tags(opt: str, unknown) -> str:
    """The one line for ``--only`` / ``--skip`` tags that select nothing."""
    return (f"{opt}: unknown tag(s) {', '.join(unknown)}; use a family "
            f"({', '.join(FAMILIES)}), a model, a feature or a case name")


def select_rows(cases, only=(), skip=()) -> list[Case]:
    """The rows of ``cases`` carrying a tag of ``only`` (all rows if empty) and none of ``skip``.

    Raises:
        UsageError: a tag that selects nothing (the message lists the families).
    """
    cases = list(cases)
    known = tags_of(cases)
    for opt, tags in (("--only", only), ("--skip", skip)):
        unknown = [t for t in tags if t not in known]
        if unknown:
            raise UsageError(unknown_tags(opt, unknown))
    return [c for c in cases if (not only or c.all_tags & set(only)) and not (c.all_tags & set(skip))]
