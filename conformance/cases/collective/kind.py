"""The ``collective`` kind's declaration: the op and layout cases
(:mod:`conformance.cases.collective.run`, a deterministic cover), the search row
(:mod:`conformance.cases.collective.search`, Hypothesis over the draw) and the same cases over
torch_xla on PJRT (:mod:`conformance.cases.collective.xla`), one evaluator.

The verdicts do not depend on the DDP under test: each (case, runtime, world size, profile)
is computed once per session and repeated for every implementation.
"""
from __future__ import annotations

from conformance.cases.collective.ops import LAYOUT_OPS, OPS
from conformance.cases.collective.run import evaluate_collective, every_check
from conformance.cases.collective.search import evaluate_search
from conformance.cases.collective.xla import evaluate_pjrt
from conformance.cases.kinds import Kind

#: Why the search row does not run on a runtime other than CPU.
SEARCH_ELSEWHERE = ("the collective search runs on the CPU runtime: on XLA every drawn shape and dtype "
                    "would compile a new graph; the op cases are the deterministic cover there")


def evaluate(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``collective`` row (:class:`conformance.cases.kinds.Kind` ``evaluate``)."""
    if runtime == "pjrt":  # torch_xla's collectives (xla.py); other runtimes: evaluate_collective says
        return evaluate_pjrt(case, impl, w, session)
    if not case.args.get("search"):
        return evaluate_collective(case, impl, runtime, w, session, overrides)
    if runtime != "cpu":  # reached for xrt and runtimes to come
        return every_check(case, impl, runtime, w, "skip", SEARCH_ELSEWHERE)
    key = ("collective", case.name, runtime, w, session.settings.profile)
    return session.memo(key, lambda: evaluate_search(case, impl, runtime, w, session))


def validate(case) -> str | None:
    """The search row reports result and agreement; another row names an op of :data:`OPS` (and
    maybe a layout of :data:`~conformance.cases.collective.ops.LAYOUT_OPS` that applies to the op)
    and reports that op's checks."""
    if case.args.get("search"):
        ok = tuple(case.checks) == ("result", "agreement")
        return None if ok else "the collective search row reports the checks ('result', 'agreement')"
    op, layout = case.args.get("op"), case.args.get("layout")
    if op not in OPS:
        return f"unknown collective op {op!r}; known: {', '.join(OPS)}"
    if layout is not None:
        if layout not in LAYOUT_OPS:
            return f"unknown collective layout {layout!r}; known: {', '.join(LAYOUT_OPS)}"
        if op not in LAYOUT_OPS[layout]:
            return f"the layout {layout} is not drawn for {op}; it is for {', '.join(LAYOUT_OPS[layout])}"
    want = ("result", "agreement", "coverage") if OPS[op].agree else ("result", "coverage")
    if tuple(case.checks) != want:
        return f"a collective row of {op} reports the checks {want}"
    return None


KIND = Kind("collective", evaluate, validate=validate)
