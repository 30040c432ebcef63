"""The ``train`` kind: the standard training loop on every replica
(:func:`~conformance.cases.train.loop.train_replica`), judged against the single-device
reference (:mod:`~conformance.cases.train.reference`) by the check table and by replica
agreement (:mod:`conformance.cases.checks`)."""
from __future__ import annotations

from fixtures.models import MODELS

from conformance.cases.checks import AGREEMENT, CHECKS, judge, judge_agreement
from conformance.cases.train.loop import RunSpec
from conformance.cases.train.reference import reference_run
from conformance.tolerances import lookup
from conformance.errors import Unsupported
from conformance.verdict import Verdict
from conformance.impls.builtin import resolve_impl
from conformance.worlds.runtimes import world_for


def train_checks(model: str, run: dict) -> tuple:
    """The checks a ``train`` row on ``model`` with run overrides ``run`` reports: the
    check-table rows that apply to it, then replica agreement."""
    spec = RunSpec(impl="-", model=model, lr=0.1, steps=1, global_batch=2, seed=0, **run)
    return tuple(n for n, c in CHECKS.items() if c.applies(MODELS[model], spec)) + (AGREEMENT,)


def evaluate_train(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``train`` row (``overrides``: RunSpec fields, e.g. ``seed``, ``lr``, ``steps``)."""
    row = resolve_impl(impl)
    where = f"{runtime}:{row.topology[runtime]}" if row.topology.get(runtime) else runtime
    if MODELS[case.model].unsupported.get(where):  # the runtime cannot train it, whatever the DDP
        raise Unsupported(f"runtime {where}: {MODELS[case.model].unsupported[where]}")
    spec = RunSpec.from_table(runtime, impl, case.model, case.tolerance, **dict(case.train, **overrides))
    world_runtime, n = world_for(runtime, row.topology.get(runtime), w)
    reps = session.trajectories(world_runtime, n, spec)
    if reps is None:
        return None
    ref = reference_run(spec, w, world_runtime)  # the quirks of the runtime that ran it
    tol = lookup(runtime, case.model, case.tolerance)
    out = []
    for name in case.checks:
        if name == AGREEMENT and not row.holds_copies:
            out.append(Verdict(case.name, name, impl, runtime, case.model, w, "skip",
                               reason=f"{impl} {row.no_copies_reason}"))
        elif name == AGREEMENT:
            out.append(judge_agreement(reps, case=case.name, impl=impl, runtime=runtime, model=case.model,
                                       atol=lookup(runtime, case.model, "agreement").atol))
        else:
            out.append(judge(CHECKS[name], reps, ref, tol, case=case.name, impl=impl, runtime=runtime,
                             model=case.model, world_size=w))
    return out
