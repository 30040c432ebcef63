"""The scenario case runner: a row's explicit scenarios and generated ones (Hypothesis) run on
the session's world, each judged against the oracle (:mod:`.oracle`); a failing one shrunk to a
minimal scenario and reported with its JSON and the command that replays it."""
from __future__ import annotations

from dataclasses import replace
import json

from conformance.cases.scenario.crashes import MAX_EXCLUDED, culprit, drawn, excluded, phrase
from conformance.cases.scenario.explicit import explicit_scenarios
from conformance.cases.scenario.format import Scenario
from conformance.cases.scenario.generate import Space, judged_on, scenario_tolerance, scenarios, space_problem
from conformance.cases.scenario.oracle import judge_scenario
from conformance.cases.scenario.replica import scenario_task
from conformance.cases.shared.checks import SCENARIO_CHECKS
from conformance.cases.shared.search import SearchRunner, kit_settings, profile_budget
from conformance.cases.surface import cells_of, joint_cells
from conformance.errors import Unsupported
from conformance.tolerances import lookup
from conformance.verdict import Verdict
from conformance.worlds.failure import ReplicaFailed
from conformance.worlds.runtimes import get_runtime


def run_scenario_case(space: Space, runner, tol, agreement_atol: float, max_examples: int,
                      shrink: bool = True) -> list:
    """Run ``max_examples`` generated scenarios, then the explicit ones, on ``runner`` (a
    :class:`conformance.cases.shared.search.SearchRunner`), each judged with ``tol(scenario)`` (its
    workload's tolerance row); Hypothesis shrinks a failing scenario - one a replica raised on too -
    to a minimal one (unless ``shrink`` is false). A scenario a replica raised on, with no other
    failure found, has its culprit statement excluded and the scenarios drawn again (at most
    :data:`~.crashes.MAX_EXCLUDED` times), so the other defects still show; the crash is reported
    with the verdicts. Returns one :class:`~conformance.verdict.Verdict` per
    :data:`~conformance.cases.shared.checks.SCENARIO_CHECKS` (case fields filled by the caller).

    Raises:
        Unsupported: the implementation cannot serve the scenarios.
    """
    crashes = []  # (minimal scenario, its exception, the statement excluded or None)
    while True:
        state, worst, exc = _search(space, runner, tol, agreement_atol, max_examples, shrink)
        if exc is None:
            return _with_crashes(_pass_verdicts(runner, state, worst), crashes, runner)
        if isinstance(runner.error, Unsupported):
            raise runner.error from None
        if state["failing"] is not None:
            if "crash" in state:  # found in the same search: reported, nothing excluded
                crashes.append(state["crash"] + (None,))
            return _with_crashes(_failure_verdicts(runner, state, worst, shrink), crashes, runner)
        if "crash" not in state:  # a bound passed or a host died (the world restarts), or a kit error
            return _with_crashes(_crash_verdicts(runner, state, exc), crashes, runner)
        sc, err = state["crash"]
        statement = None
        if shrink and len(crashes) < MAX_EXCLUDED:
            statement = culprit(sc, lambda alt: _raises(runner, alt), drawn(space))
        crashes.append((sc, err, statement))
        if statement is None:
            return _with_crashes(None, crashes, runner)
        space = replace(space, exclude=space.exclude + (statement,))


def _search(space, runner, tol, agreement_atol, max_examples, shrink):
    """One search over ``space``: ``(state, worst, exception or None)``."""
    from hypothesis import given

    worst: dict = {}
    # + "crashed": a Scenario (a failure that breaks the world); "crash": (Scenario, ReplicaFailed),
    # the last scenario a replica raised on (Hypothesis reruns the minimal one last); "cells": what
    # the keyword scenarios exercised (surface.cells_of); "left_out": scenarios not run, per cause
    state = {"examples": 0, "vacuous": 0, "failing": None, "unsupported": {}, "cells": set(), "left_out": {}}
    check = _checker(space, runner, tol, agreement_atol, state, worst)
    # the explicit scenarios are reported as they are; max_examples 0: only they run (Hypothesis
    # refuses a zero budget)
    test = kit_settings(max_examples, shrink)(given(sc=scenarios(runner.world_size, space))(check)) \
        if max_examples > 0 else None
    try:
        if test is not None:
            test()
        for e in explicit_scenarios(runner.world_size, space):
            check(e)
    except Exception as exc:
        return state, worst, exc
    return state, worst, None


class ScenarioCrash(Exception):
    """A replica raised on a generated scenario (the world is kept): a failing example that
    Hypothesis shrinks like any other, apart from the failing judgements."""


def _raises(runner, sc) -> bool | None:
    """Whether a replica raises on scenario ``sc`` (another outcome - a pass, a failing judgement,
    an unsupported corner - is not the crash); None when the world broke (a bound passed, a host
    died): nothing more can be learnt on it."""
    try:
        runner.run(scenario_task, scenario=sc.to_json())
    except ReplicaFailed:
        runner.error = None
        return True
    except Unsupported:
        runner.error = None
    except Exception:
        return None
    return False


def _checker(space: Space, runner, tol, agreement_atol: float, state: dict, worst: dict):
    """``check(sc)``: run scenario ``sc`` on ``runner`` and judge it, into ``state`` and ``worst``
    (per check, the passing verdict of largest deviation); raises ``AssertionError`` on a failing
    scenario and :class:`ScenarioCrash` on one a replica raised on. The Hypothesis test: its code
    seeds the derandomized draw."""
    def check(sc: Scenario):
        held = excluded(sc, space)
        if held is not None:  # a statement a replica crashed on: drawn again without it
            _leave_out(state, f"excluded after a replica crash: {phrase(held)}", sc)
            return
        try:
            results = runner.run(scenario_task, scenario=sc.to_json())
        except Unsupported as exc:
            # The implementation lacks a corner, a keyword or a method this example needs: this
            # example is unsupported, the others still run (SearchRunner would re-raise it for all).
            runner.error = None
            state["unsupported"].setdefault(str(exc), sc.describe_workload() or "plain workload")
            _leave_out(state, f"unsupported: {exc}", sc)
            return
        except ReplicaFailed as exc:
            # a replica raised and the world is kept: a failing example, shrunk like the others
            runner.error = None
            state["crash"] = (sc, exc)
            raise ScenarioCrash(exc.summary()) from None
        except Exception:
            # a bound passed or a host died: the runner re-raises this failure for every later
            # example (each would restart the world), so the first scenario is the one reported
            state.setdefault("crashed", sc)
            raise
        vs = judge_scenario(sc, results, tol(sc), agreement_atol=agreement_atol)
        state["examples"] += 1
        if "keywords" in space.ddp_extra:
            state["cells"] |= cells_of(sc)
        bad = [v for v in vs if v.status == "fail"]
        if bad:
            state["failing"] = (sc, vs)
            state.setdefault("first_failing", (sc, vs))  # unshrunk: it trained enough to judge
            raise AssertionError("; ".join(f"{v.check}: {v.reason}" for v in bad))
        if any(v.status == "vacuous" for v in vs if v.check == "params"):
            state["vacuous"] += 1
            return
        for v in vs:
            if v.status == "pass" and v.max_dev == v.max_dev and (
                    v.check not in worst or v.max_dev > worst[v.check].max_dev):
                worst[v.check] = v
    return check


def _leave_out(state: dict, cause: str, sc) -> None:
    """Count scenario ``sc`` as not run, for ``cause`` (coverage counts the programs left out)."""
    state["left_out"][cause] = state["left_out"].get(cause, 0) + 1


def _crash_text(runner, sc, exc, statement) -> str:
    """The diagnosis of a replica crash on the minimal scenario ``sc``."""
    cut = (f"; excluded, and the scenarios drawn again without it: {phrase(statement)}" if statement else
           "; no single statement of the scenario makes it stop (every change tried still crashes)")
    return (f"minimal crashing scenario ({len(sc.steps)} step(s), world size {sc.world_size}{cut}):\n"
            f"{json.dumps(sc.to_json())}\nreproduce: python -m conformance replay SCENARIO.json "
            f"--ddp {runner.impl} --runtime {runner.runtime}\n{exc}")


def _with_crashes(verdicts, crashes: list, runner) -> list:
    """``verdicts`` (None: every check fails on the last crash) with the replica crashes found on
    the way: a check that failed keeps its verdict and names the crashes; one that passed without
    the crashing statements fails on the first crash, saying what passed without it."""
    if not crashes:
        return verdicts
    sc, exc, statement = crashes[0]
    first = (exc.summary() if isinstance(exc, ReplicaFailed) else str(exc)).strip().split(". ")[0][:200]
    where = f" under {phrase(statement)}" if statement else ""
    note = f"replica crash{where} on a minimal scenario ({len(sc.steps)} step(s)): {first}"
    text = "\n\n".join(_crash_text(runner, c, e, st) for c, e, st in crashes)
    out = []
    for c in SCENARIO_CHECKS:
        v = next((u for u in verdicts or () if u.check == c), None)
        if v is not None and v.status == "fail":
            v.reason += f"; also a {note}"
            v.diagnosis = f"{v.diagnosis}\n\n{text}" if v.diagnosis else text
            out.append(v)
            continue
        after = (f"; with it excluded: {v.status}" + (f" ({v.reason})" if v.reason else "")
                 if v is not None and statement else "")
        out.append(Verdict("", c, "", "", "scenario", runner.world_size, "fail", reason=note + after,
                           diagnosis=text, example=sc.to_json(),
                           programs=v.programs if v is not None else {}))
    return out


def _crash_verdicts(runner, state: dict, exc: BaseException) -> list:
    """Every check failed by a replica failure (or a kit error) ``exc``, with the scenario the
    replicas failed on (not shrunk: the runner re-raises a replica failure for later examples)."""
    crashed = state.get("crashed")
    text = ("\n".join(getattr(exc, "__notes__", [])) + f"\n{type(exc).__name__}: {exc}" if crashed is None else
            f"the scenario a replica failed on ({len(crashed.steps)} step(s), world size "
            f"{crashed.world_size}; not shrunk: a replica failure is re-raised for later examples):\n"
            f"{json.dumps(crashed.to_json())}\nreproduce: python -m conformance replay SCENARIO.json "
            f"--ddp {runner.impl} --runtime {runner.runtime}\n{type(exc).__name__}: {exc}")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    corners = crashed.describe_workload() if crashed is not None else ""
    dims = f" ({corners})" if corners else ""
    return [Verdict("", c, "", "", "scenario", runner.world_size, "fail",
                    reason=f"replica failure on a scenario{dims}: {first}", diagnosis=text.strip(),
                    example=None if crashed is None else crashed.to_json())
            for c in SCENARIO_CHECKS]


def _failure_verdicts(runner, state: dict, worst: dict, shrink: bool) -> list:
    """The verdicts of the minimal failing scenario (a check it moved too little to judge: from
    the passing or the first failing scenario, :func:`~.generate.judged_on`), each with the
    scenario it was judged on and the command that replays it."""
    sc, vs = state["failing"]
    out = []
    for v, on in judged_on(sc, vs, *state["first_failing"], worst, state["examples"]):
        if on is None:
            out.append(v)
            continue
        what = "minimal failing" if on is sc and shrink else "failing"
        if on is not sc:
            what += " (unshrunk; the minimal one moved too little to judge this check)"
        v.example = on.to_json()
        v.diagnosis = (f"{what} scenario ({len(on.steps)} step(s), world size {on.world_size}):\n"
                       f"{json.dumps(on.to_json())}\nreproduce: python -m conformance replay SCENARIO.json --ddp "
                       f"{runner.impl} --runtime {runner.runtime}" + (f"\n{v.diagnosis}" if v.diagnosis else ""))
        out.append(v)
    return out


def _pass_verdicts(runner, state: dict, worst: dict) -> list:
    """Per check the worst passing verdict, its reason counting the scenarios (vacuous ones,
    keyword cells, the scenarios left out and why); ``vacuous`` when every scenario moved too
    little. ``programs`` counts the scenarios run and left out (the coverage line counts them)."""
    n = state["examples"]
    unsup, left = state["unsupported"], state["left_out"]
    if unsup and not n:
        raise Unsupported("every scenario: " + "; ".join(f"{why} ({wl})" for why, wl in unsup.items()))
    out = []
    for c in SCENARIO_CHECKS:
        v = worst.get(c) or Verdict("", c, "", "", "scenario", runner.world_size, "pass")
        v.reason = f"{n} scenario(s)" + (f", {state['vacuous']} vacuous (discarded)" if state["vacuous"] else "")
        if state["cells"]:  # docs/transparency.md: the keyword x module/loop map
            v.reason += f"; {len(state['cells'])} of {joint_cells()} keyword x module/loop cells"
        if left:  # what this implementation refused or crashed on, said where the pass is reported
            v.reason += (f"; {sum(left.values())} left out: "
                         + "; ".join(f"{k} ({m})" for k, m in list(left.items())[:3]))
        if unsup:
            v.reason += ("; unsupported corner(s) skipped: "
                         + "; ".join(f"{wl}: {why}" for why, wl in list(unsup.items())[:3]))
        v.programs = {"run": n, "left_out": dict(left)}
        if n == state["vacuous"]:
            v.status, v.reason = "vacuous", f"all {n} scenario(s) moved too little to fail"
        elif c not in worst and c == "eval_outputs":
            v.status, v.reason = "skip", f"none of the {n} scenario(s) ran a forward without backward: no output to compare"
        out.append(v)
    return out


def evaluate_scenario(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``scenario`` row: its space's scenarios within the session profile's
    budget, or with ``overrides["scenario"]`` that one scenario (``python -m conformance
    replay``); ``overrides["shrink"]``: shrink a failing scenario, default true."""
    agree = lookup(runtime, "scenario", "agreement").atol
    if "scenario" in overrides:  # one given scenario (python -m conformance replay)
        sc = overrides["scenario"]
        results = session.run(runtime, w, scenario_task, timeout=case.timeout, impl=impl, scenario=sc.to_json())
        return None if results is None else judge_scenario(sc, results, scenario_tolerance(runtime, sc),
                                                           agreement_atol=agree)
    runner = SearchRunner(lambda fn, **p: session.run(runtime, w, fn, timeout=case.timeout, **p), runtime, w, impl)
    space = Space(**case.args.get("space", {}))
    rt = get_runtime(runtime)
    b = profile_budget(session.profile)
    if space.topology:  # drawn graphs: on a runtime that compiles each, every example a new compilation
        if rt.compiled_graphs:
            return [Verdict("", c, "", "", "scenario", w, "skip", reason=f"runtime {runtime} compiles every "
                            "distinct graph: generated topologies are drawn on CPU") for c in SCENARIO_CHECKS]
        st = session.settings
        space = replace(space, max_nodes=min(space.max_nodes, st.topology_nodes))
        return run_scenario_case(space, runner, lambda sc: scenario_tolerance(runtime, sc), agree,
                                 st.topologies or b.topologies, overrides.get("shrink", True))
    # Where each distinct graph is compiled: few shapes, XLA's corners (docs/runtimes/pjrt.md).
    space = replace(space, rank_uniform=space.rank_uniform or rt.uniform_graphs,
                    few_shapes=space.few_shapes or rt.compiled_graphs,
                    xla_corners=space.xla_corners or rt.compiled_graphs)
    # The workload draw and, where each distinct graph is compiled, the loop programs have their own
    # budget columns (there every drawn one is new graphs: explicit scenarios only by default).
    if space.loop:  # deeper programs under a larger profile
        space = replace(space, max_pattern=b.loop_depth)
    examples = ((b.workloads_compiled if rt.compiled_graphs else b.workloads) if space.workload
                else round(b.loops_compiled * space.budget) if space.loop and rt.compiled_graphs
                else max(1, round(b.scenarios * space.budget)))
    return run_scenario_case(space, runner, lambda sc: scenario_tolerance(runtime, sc), agree, examples,
                             overrides.get("shrink", True))


def scenario_problem(case) -> str | None:
    """What is wrong with a ``scenario`` row's ``args["space"]`` (:func:`~.generate.space_problem`)."""
    why = space_problem(case.args.get("space", {}))
    return f"scenario space: {why}" if why else None
