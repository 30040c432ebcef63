"""Where every distinct graph is compiled (XLA), generated examples draw their shapes from a
few that repeat (docs/runtimes/pjrt.md; benchmarks/README.md, session 6), and keep varying."""
from dataclasses import replace

import pytest

from conformance.cases.property.strategies import (FEW_BN_WIDTHS, FEW_LOCAL_BATCHES, FEW_MLP_WIDTHS, bn_examples,
                                                   mlp_examples)
from conformance.cases.scenario.generate import FEW_BATCHES, FEW_PLANS, FEW_UNUSED_PLANS, Space, scenarios
from conformance.cases.scenario.run import evaluate_scenario
from tests.draws import draw_examples
from conformance.worlds.runtimes import get_runtime

pytestmark = pytest.mark.cpu


def _draw(strategy, n=80):
    return draw_examples(strategy, n)


def test_only_xla_runtimes_compile_per_graph():
    assert get_runtime("pjrt").compiled_graphs and get_runtime("xrt").compiled_graphs
    assert not get_runtime("cpu").compiled_graphs


def test_property_examples_draw_from_the_few_shapes():
    few = _draw(mlp_examples(2, few_shapes=True))
    assert {e.widths for e in few} <= set(FEW_MLP_WIDTHS)
    assert {e.local_batch for e in few} <= set(FEW_LOCAL_BATCHES)
    assert len({(e.widths, e.local_batch) for e in few}) >= 6  # still several architectures
    full = _draw(mlp_examples(2))
    assert len({e.widths for e in full}) > len(FEW_MLP_WIDTHS)  # the CPU draw is unchanged
    assert {e.widths for e in _draw(bn_examples(2, few_shapes=True))} <= set(FEW_BN_WIDTHS)


def _micro_steps(space, n=40):
    return [m for sc in _draw(scenarios(2, space), n) for st in sc.steps for m in st["micro"]]


def test_scenarios_draw_few_batch_sizes_and_plans():
    micro = _micro_steps(replace(Space(), rank_uniform=True, few_shapes=True))
    assert {b for m in micro for b in m["batch"]} <= set(FEW_BATCHES)
    plans = {tuple(p) for m in micro for p in m["plan"]}
    assert plans <= set(FEW_PLANS + FEW_UNUSED_PLANS)
    # every kind of plan is still drawn: both hook orders, a branch left out, none run
    assert {("c", "b", "a"), ("a", "b", "c"), ()} <= plans and plans & set(FEW_UNUSED_PLANS[:2])
    full = {tuple(p) for m in _micro_steps(replace(Space(), rank_uniform=True)) for p in m["plan"]}
    assert len(full) > len(plans)  # the CPU draw is unchanged


def test_scenarios_on_compiled_runtimes_use_the_few_shapes(monkeypatch):
    """evaluate_scenario turns the few-shapes draw on exactly where graphs are compiled."""
    seen = {}

    def fake_run(space, runner, *a, **k):
        seen[runner.runtime] = space
        return []
    monkeypatch.setattr("conformance.cases.scenario.run.run_scenario_case", fake_run)
    from conformance.cases import CASES
    from conformance.evaluate import Session
    case = CASES["scenario.core"]
    for rt in ("cpu", "pjrt"):
        evaluate_scenario(case, "ref", rt, 2, Session(), {})
    assert seen["pjrt"].few_shapes and seen["pjrt"].rank_uniform
    assert not seen["cpu"].few_shapes and not seen["cpu"].rank_uniform


def test_fast_compile_flags_are_added_unless_the_user_sets_them():
    from ddp_impl.runtime.xla import FAST_COMPILE_FLAGS, fast_compile_flags
    level, emitters, split = FAST_COMPILE_FLAGS
    assert fast_compile_flags("") == f"{level} {emitters} {split}"
    assert fast_compile_flags("--xla_dump_to=d") == f"--xla_dump_to=d {level} {emitters} {split}"
    assert (fast_compile_flags("--xla_backend_optimization_level=2")
            == f"--xla_backend_optimization_level=2 {emitters} {split}")
    assert fast_compile_flags("--xla_cpu_use_fusion_emitters=true") == f"--xla_cpu_use_fusion_emitters=true {level} {split}"
    assert (fast_compile_flags("--xla_cpu_parallel_codegen_split_count=32")
            == f"--xla_cpu_parallel_codegen_split_count=32 {level} {emitters}")
    # a flag whose name only starts like one of ours is not ours
    assert fast_compile_flags("--xla_backend_optimization_level_x=1").endswith(f"{level} {emitters} {split}")
    env = get_runtime("pjrt").host_envs(2)[0]
    assert all(f in env["XLA_FLAGS"].split() for f in FAST_COMPILE_FLAGS)
