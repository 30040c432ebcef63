"""The row type of the case table (:mod:`conformance.cases.table`) and tag selection: data
only, under the kinds that evaluate it (it imports none of them).

One row (in the spirit of PyTorch's OpInfo) per case: parity on a model, a DDP
feature, a Hypothesis property, a rank invariant, generated scenarios, a collective. A row says
how it is evaluated (``kind``, a name of :data:`conformance.cases.kinds.REGISTRY`; each
kind's ``KIND`` lives with its evaluator, ``conformance.cases.<kind>.kind``, and
:func:`conformance.evaluate.evaluate` dispatches to it).

``must_kill`` names the catalog mutants the case must fail: the only place the
mutant <-> case relation is stored. :func:`conformance.cases.validation.validate`
checks the rows when the table is first used and raises ``ValueError`` naming the row.

A row names code by reference, ``"package.module:attr"`` (:func:`resolve`, on first use), so the
tables that hold such rows - the case table, the implementation rows
(:data:`conformance.impls.builtin.ROWS`), the mutant catalog - load without torch and the CLI
checks names against them before torch is imported.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable
from conformance.errors import UsageError

#: Case families (also tags).
FAMILIES = ("parity", "feature", "property", "invariant", "scenario", "collective")


@dataclass(frozen=True)
class Case:
    """One row of the case table.

    Attributes:
        name: unique id, ``<family>.<name>`` (e.g. ``feature.no_sync``).
        family: one of :data:`FAMILIES`.
        description: what a conforming DDP does, one sentence.
        kind: how it is evaluated (see the module docstring).
        model: the model (``fixtures.models.MODELS``) or ``"-"``.
        tolerance: the tolerance key: a dtype row of ``conformance.tolerances`` (``float32``,
            ``bf16-autocast``, ``exact``) or ``grad`` (the gradient tolerances of the properties).
        train: for ``train``: RunSpec overrides (``setups``, ``ddp_kwargs``, ``requires``,
            ``momentum``, ``broadcast_buffers``...).
        task / judge: for ``task``: references (:func:`resolve`) to ``task(ctx, impl, **args)
            -> dict``, run on every replica, and ``judge(results, impl, runtime) -> list[Verdict]``.
        args: for ``task``: keyword arguments of ``task``; for ``scenario``: ``{"space": {...}}``,
            the fields of the scenarios' ``Space``.
        prop: for ``property``: the property name (a key of the property kind's ``PROPERTIES``).
        checks: the check names the case reports (one verdict each, whatever the outcome, so
            verdict ids are stable).
        tags: extra selection tags (feature names); the family, the model and the name are tags
            too (see :attr:`all_tags`).
        must_kill: catalog mutants this case must fail.
        timeout: bound on one world task in seconds (``None``: the world's).
        world_sizes: ``{runtime: (W, ...)}``: the world sizes the case runs at when none are given
            (``--world-size`` absent), instead of the runtime's defaults (the runtime adapter's
            ``default_world_sizes``); e.g. two groups of two need W=4.
    """

    name: str
    family: str
    description: str
    kind: str
    model: str = "-"
    tolerance: str = "float32"
    train: dict = field(default_factory=dict)
    task: str | Callable | None = None
    judge: str | Callable | None = None
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


def resolve(ref):
    """What a row names by reference: ``"package.module:attr"``, imported on first use; any
    other value (a callable a row holds itself, ``None``) is returned as it is.

    Raises:
        ValueError: a string that is not ``module:attr``.
        ImportError, AttributeError: the module does not import, or has no ``attr``.
    """
    if not isinstance(ref, str):
        return ref
    module, colon, attr = ref.partition(":")
    if not (colon and module and attr):
        raise ValueError(f"{ref!r} is no reference: need 'package.module:attr'")
    return getattr(importlib.import_module(module), attr)


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
