"""``scenario.zoo``: the loop programs of ``scenario.user_loop`` on real models drawn from the
kit's zoo (:mod:`fixtures.zoo`, docs/zoo.md).

Each run draws the profile's number of zoo models of its cost class
(:attr:`~conformance.cases.shared.search.Budget.zoo`, ``zoo_cost``; the programs: ``zoo_programs``)
from a fixed seed, so a
profile always draws the same models whatever is installed; each is judged as ``--model
zoo:NAME`` judges it (its bound measured on the model, :func:`.userloop.evaluate_user_loop`). A
drawn model whose library is not installed is skipped with the reason; the models after a
failing one are not run. Per check: the first failing model's verdict (its reason and reproduce command name the model), else the first
model's, its reason naming every model run.
"""
from __future__ import annotations

from dataclasses import replace

from conformance.cases.scenario.userloop import evaluate_user_loop
from conformance.cases.shared.search import profile_budget
from conformance.verdict import Verdict
from fixtures.zoo import draw, unavailable

#: The seed of the draw (fixed: a profile's draw is reproducible).
DRAW_SEED = 47


def drawn_models(profile: str | None) -> list[str]:
    """The zoo specs (``zoo:NAME``) profile ``profile`` draws."""
    b = profile_budget(profile)
    return draw(DRAW_SEED, b.zoo, b.zoo_cost)


def evaluate_zoo(case, impl, runtime, w, session, overrides):
    """Verdicts of ``scenario.zoo`` (module docstring); ``None`` on a non-root process of a
    launcher-built world."""
    specs = drawn_models(session.profile)
    pick = profile_budget(session.profile).zoo_programs
    runs, skipped = {}, []
    for spec in specs:
        missing = unavailable(spec)
        if missing:
            skipped.append(missing)
            continue
        vs = evaluate_user_loop(replace(case, model=spec, name="scenario.user_loop"), impl, runtime, w, session,
                                overrides, pick)
        if vs is None:
            return None
        runs[spec] = {v.check: v for v in vs}
        if any(v.status not in ("pass", "vacuous") for v in vs):
            break  # the first failing model is the verdict: the rest would cost without changing it
    if not runs:
        why = "; ".join(skipped) or "the profile draws no zoo model"
        return [Verdict(case.name, c, impl, runtime, "-", w, "skip", reason=why) for c in case.checks]
    out = []
    for c in case.checks:
        bad = [(s, r[c]) for s, r in runs.items() if r[c].status not in ("pass", "vacuous")]
        spec, v = bad[0] if bad else (next(iter(runs)), runs[next(iter(runs))][c])
        v.reason = (f"{spec}: {v.reason}" if bad else
                    f"{len(runs)} zoo model(s) ({', '.join(runs)}); {spec}: {v.reason}")
        if skipped:
            v.reason += f"; skipped: {'; '.join(skipped)}"
        out.append(v)
    return out
