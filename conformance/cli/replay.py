"""``python -m conformance replay SCENARIO.json``: rerun one generated scenario (the
minimal failing one a scenario case wrote, or a hand-made one) against implementations."""
from __future__ import annotations

from dataclasses import replace

from conformance.cases.scenarios.scenario import ScenarioError, load_scenario
from conformance.cases.table import CASES
from conformance.errors import UsageError
from conformance.evaluate import Session, evaluate
from conformance.options import parse_matrix
from conformance.report.text import exit_code, verdict_table
from conformance.settings import Settings


def command(settings: Settings, *, scenario: str, runtime: str, ddp: str | None) -> int:
    """Rerun one scenario (a file written by a failing scenario case, or hand-made)."""
    try:
        sc = load_scenario(scenario)
    except ScenarioError as exc:
        raise UsageError(f"{scenario}: {exc}" if not str(exc).startswith(scenario) else str(exc)) from None
    targets = parse_matrix(runtime, str(sc.world_size), ddp)
    case = replace(CASES["scenario.core"], name="scenario.replay", description=f"replay of {scenario}")
    session = Session(settings=settings)
    try:
        verdicts = [v for rt, w, impls in targets for impl in impls
                    for v in evaluate(case, impl, rt, w, session, scenario=sc)]
    finally:
        session.close()
    print(f"scenario {scenario}: {len(sc.steps)} step(s), world size {sc.world_size}")
    print(verdict_table(verdicts))
    return exit_code(verdicts)
