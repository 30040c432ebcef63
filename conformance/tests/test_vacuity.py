"""The vacuity guard: a comparison that cannot fail must not be reported as a pass."""
import pytest

pytestmark = pytest.mark.cpu


def test_tiny_lr_is_vacuous_not_pass(world_pool, runner):
    # The upstream trap: lr=1e-100 makes every DDP, broken or not, match.
    world_pool.get("cpu", 2)
    for impl in ("ref", "mutant:no_grad_sync"):
        verdicts = runner.verdicts("cpu", 2, impl, "linear", lr=1e-100)
        assert {v.status for v in verdicts.values()} == {"vacuous"}, verdicts
        assert "cannot fail" in verdicts["param_parity"].reason


def test_world_size_one_is_vacuous(world_pool, runner):
    world_pool.get("cpu", 1)
    verdicts = runner.verdicts("cpu", 1, "ref", "linear")
    assert verdicts["param_parity"].status == "vacuous"
    assert "world size 1" in verdicts["param_parity"].reason


def test_failure_wins_over_vacuity(world_pool, runner):
    # A mismatch is reported as a failure even when the run is short.
    world_pool.get("cpu", 2)
    v = runner.verdicts("cpu", 2, "mutant:no_initial_broadcast", "linear", steps=1)["param_parity"]
    assert v.status == "fail" and v.first_bad_step == 1
