"""Case kinds: the :class:`Kind` type and the one registry of kinds (:data:`REGISTRY`).

Each kind module declares its ``KIND = Kind(...)`` beside its evaluator; :data:`REGISTRY` has one
line per kind naming that module, plus what the layers below the kinds read before any kind
module is imported (whether its rows run an implementation under test:
``conformance.impls.row.STRATEGY_KINDS`` derives from it). A leaf: it imports nothing of the kit,
so the kinds and the implementation layer may both import it; the modules are loaded, and their
``KIND`` checked against the registry, by :func:`conformance.cases.validation.kinds`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Kind:
    """How rows of one kind are validated and evaluated. Every callable receives the row
    (:class:`~conformance.cases.row.Case`).

    Attributes:
        name: the kind's name (``Case.kind``; its line of :data:`REGISTRY`).
        evaluate: ``(case, impl, runtime, world_size, session, overrides) -> list[Verdict] | None``:
            one verdict per ``case.checks`` entry (``None`` on a non-root process of a
            launcher-built world); ``impl`` a ``--ddp`` spec, ``session`` a
            :class:`conformance.evaluate.Session`, ``overrides`` a dict of run overrides. It may
            raise :class:`~conformance.errors.Unsupported` or a world's ``ReplicaError``.
        validate: ``(case) -> str | None``: what is wrong with the row's kind-specific columns
            (one line, the table names the row), or ``None``. Default: nothing to check.
        checks: ``(case) -> tuple[str, ...]``: the checks a row reports when they derive from
            its other columns (``train``: from the check table); ``None``: the row's own.
        requires: ``(case) -> tuple[str, ...]``: the DDP keywords and methods a row needs an
            implementation to honour (else it is ``unsupported``). Default: none.
        uses: ``(case) -> tuple[str, ...]``: what of an implementation a row exercises without
            requiring it (``sync_bn``: it trains a SyncBatchNorm), so a mutant's claim of it is
            used. Default: none.
        searches: rows run a Hypothesis search: ``overrides["shrink"]`` (shrink a failing example)
            is passed, and the rows need a world the kit spawns (each example follows the last).
    """

    name: str
    evaluate: Callable
    validate: Callable = lambda case: None
    checks: Callable | None = None
    requires: Callable = lambda case: ()
    uses: Callable = lambda case: ()
    searches: bool = False

    @property
    def needs_impl(self) -> bool:
        """Rows build a model through the implementation under test (its line of :data:`REGISTRY`)."""
        return REGISTRY[self.name].needs_impl


@dataclass(frozen=True)
class Registration:
    """One line of :data:`REGISTRY`.

    Attributes:
        module: the module declaring the kind's ``KIND`` (a dotted name).
        needs_impl: rows build a model through the implementation under test; ``False``: the
            verdicts do not depend on it (an implementation unsupported on a runtime, or
            refusing a kind, does not make them ``unsupported``).
        subject: what the verdicts judge (:data:`SUBJECTS`): ``"ddp"``, the implementation
            under test; ``"backend"``, the collectives beneath every DDP, judged once per
            runtime and world size and labelled with the backend's name
            (``Runtime.backend_label``), not the DDP's.
    """

    module: str
    needs_impl: bool = True
    subject: str = "ddp"

    @property
    def package(self) -> str:
        """The kind's package (``conformance.cases.<kind>``): the module's parent; the unit
        kinds may not import across packages."""
        return self.module.rsplit(".", 1)[0]


#: The registry: kind name -> its line. A new kind is its module (declaring ``KIND``), one line
#: here and its rows (docs/extending.md).
REGISTRY = {
    "train": Registration("conformance.cases.train.kind"),
    "task": Registration("conformance.cases.task.kind"),
    "property": Registration("conformance.cases.property.kind"),
    "invariant": Registration("conformance.cases.invariant.kind", needs_impl=False),
    "scenario": Registration("conformance.cases.scenario.kind"),
    "collective": Registration("conformance.cases.collective.kind", needs_impl=False, subject="backend"),
}
#: What a verdict can judge: the DDP under test, or the backend beneath it.
SUBJECTS = ("ddp", "backend")
#: Every kind's name, registry order.
KINDS = tuple(REGISTRY)
