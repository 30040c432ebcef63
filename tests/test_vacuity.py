"""The vacuity guard: a comparison that cannot fail must not be reported as a pass.

Runs on every runtime that can run here (CPU: ``ref``; PJRT: ``ref`` and
``xla_recipe``), each test under its runtime's marker.
"""
import pytest

from conformance.worlds.runtimes import RuntimeUnavailable, WorldKey, get_runtime

CASES = {"cpu": ("ref",), "pjrt": ("ref", "xla_recipe")}


@pytest.fixture(params=[pytest.param(rt, marks=getattr(pytest.mark, rt), id=rt) for rt in CASES])
def runtime(request):
    try:
        get_runtime(request.param).check(2)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")
    return request.param


def test_tiny_lr_is_vacuous_not_pass(runtime, world_pool, runner):
    # The upstream trap: lr=1e-100 makes every DDP, broken or not, match.
    world_pool.get(WorldKey(runtime, 2))
    for impl in CASES[runtime] + ("mutant:no_grad_sync",):
        verdicts = runner.verdicts(runtime, 2, impl, "linear", lr=1e-100)
        assert set(verdicts) == {"param_parity", "loss_parity"}
        assert {v.status for v in verdicts.values()} == {"vacuous"}, verdicts
        assert "cannot fail" in verdicts["param_parity"].reason


def test_world_size_one_is_vacuous(runtime, world_pool, runner):
    world_pool.get(WorldKey(runtime, 1))
    for impl in CASES[runtime]:
        verdicts = runner.verdicts(runtime, 1, impl, "linear")
        assert verdicts["param_parity"].status == "vacuous"
        assert "world size 1" in verdicts["param_parity"].reason


def test_failure_wins_over_vacuity(runtime, world_pool, runner):
    # A mismatch is reported as a failure even when the run is short.
    world_pool.get(WorldKey(runtime, 2))
    v = runner.verdicts(runtime, 2, "mutant:no_initial_broadcast", "linear", steps=1)["param_parity"]
    assert v.status == "fail" and v.first_bad_step == 1


def test_agreement_is_vacuous_when_nothing_moves(runtime, world_pool, conformance_session):
    from conformance.cases.table import CASES
    from conformance.evaluate import evaluate
    world_pool.get(WorldKey(runtime, 2))
    (v,) = [v for v in evaluate(CASES["parity.linear"], "ref", runtime, 2, conformance_session, lr=1e-100)
            if v.check == "agreement"]
    assert v.status == "vacuous" and "never changed" in v.reason
