"""``python -m conformance replay SCENARIO.json``: rerun one generated scenario (the
minimal failing one a scenario case wrote, or a hand-made one) against implementations, or one
collective draw (the shrunk one ``collective.search`` wrote) on the run's backend."""
from __future__ import annotations

import json as _json
import shlex
from dataclasses import replace

from conformance.cases.collective.search import evaluate_draw, load_draw
from conformance.cases.scenario.format import ScenarioError, load_scenario
from conformance.cases.table import CASES
from conformance.errors import UsageError
from conformance.evaluate import Session, evaluate
from conformance.options import parse_matrix
from conformance.cases.shared.checks import scenario_checks
from conformance.cli.output import stdout_for_json
from conformance.report.text import exit_code, verdict_table
from conformance.report.writers import RunOutput, write_all
from conformance.settings import Settings


def command(settings: Settings, *, scenario: str, runtime: str, ddp: str | None, json: str) -> int:
    """Rerun one scenario (a file written by a failing scenario case, or hand-made); write the
    same JSON report and failures file as ``run`` (``json``; ``-``: the JSON on stdout)."""
    draw = _collective_draw(scenario)
    if draw is not None:
        return _replay_draw(settings, scenario, *draw, runtime=runtime, ddp=ddp, json=json)
    try:
        sc = load_scenario(scenario)
    except ScenarioError as exc:
        raise UsageError(f"{scenario}: {exc}" if not str(exc).startswith(scenario) else str(exc)) from None
    targets = parse_matrix(runtime, str(sc.world_size), ddp)
    case = replace(CASES["scenario.core"], name="scenario.replay", description=f"replay of {scenario}",
                   checks=scenario_checks(loop=True))  # a program without forwards without backward: a skip
    session = Session(settings=settings)
    try:
        verdicts = [v for rt, w, impls in targets for impl in impls
                    for v in evaluate(case, impl, rt, w, session, scenario=sc)]
    finally:
        session.close()
    return _report(settings, verdicts, scenario, json,
                   f"scenario {scenario}: {len(sc.steps)} step(s), world size {sc.world_size}",
                   lambda v: f"python -m conformance replay {shlex.quote(scenario)} "
                   f"--ddp {shlex.quote(v.impl)} --runtime {v.runtime}")


def _report(settings, verdicts, path, json, title, repro) -> int:
    """Print the replay's verdicts, write the JSON report and failures file; the exit code."""
    with stdout_for_json(json) as json_out:
        print(title)
        print(verdict_table(verdicts))
        out = RunOutput(verdicts, extra={"replay": path, "profile": settings.profile}, repro=repro)
        for line in write_all(out, {"json": json_out or json, "failures": json}):
            print(line)
        print(f"JSON report: {'stdout' if json_out else json}")
    return exit_code(verdicts)


def _collective_draw(path: str):
    """``(draw, W)`` when ``path`` holds a collective draw, else ``None`` (a scenario, or a file
    :func:`load_scenario` reports on)."""
    try:
        with open(path) as f:
            doc = _json.load(f)
    except (OSError, ValueError):
        return None
    try:
        return load_draw(doc)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _replay_draw(settings, path, draw, w, *, runtime, ddp, json) -> int:
    case = replace(CASES["collective.search"], name="collective.replay", description=f"replay of {path}")
    session = Session(settings=settings)
    try:
        impl = (ddp or "torch").split(",")[0]  # the verdicts do not depend on the DDP
        verdicts = evaluate_draw(case, impl, runtime, w, session, draw) or []
    finally:
        session.close()
    return _report(settings, verdicts, path, json, f"collective draw {path}: world size {w}",
                   lambda v: f"python -m conformance replay {shlex.quote(path)} --runtime {v.runtime}")
