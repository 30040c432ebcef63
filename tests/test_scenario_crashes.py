"""Replica crashes in generated scenarios (conformance.cases.scenario.crashes and the scenario
runner): a crash is shrunk like a failing judgement, the statement it needs is found and left out,
and the scenarios are drawn again so the DDP's other defects still show, the crash reported."""
import copy

import pytest

from conformance.cases.scenario.crashes import culprit, drawn, excluded, statements
from conformance.cases.scenario.explicit import explicit_scenarios
from conformance.cases.scenario.generate import Space, scenarios

LOOP = Space(loop=True)


def _plain_loop_program():
    """An explicit loop program (a valid scenario of the loop case)."""
    return copy.deepcopy(explicit_scenarios(2, LOOP)[0])


def test_the_culprit_is_the_statement_whose_change_stops_the_crash():
    sc = _plain_loop_program()
    sc.loop["zero_grad"] = "set_to_none"
    tried = []

    def crashes(alt):
        tried.append(alt)
        return alt.loop["zero_grad"] == "set_to_none"

    assert culprit(sc, crashes, drawn(LOOP)) == ("loop", "zero_grad", "set_to_none")
    assert all(t.loop["zero_grad"] == "set_to_none" for t in tried[:-1]) and len(tried) <= 16


def test_no_culprit_when_every_change_still_crashes_and_the_search_is_bounded():
    sc = _plain_loop_program()
    runs = []
    assert culprit(sc, lambda alt: runs.append(alt) or True, drawn(LOOP), max_runs=5) is None
    assert len(runs) == 5


def test_a_case_that_draws_no_loop_leaves_no_loop_statement_out():
    """scenario.core draws the plain loop: a crash there is never blamed on a loop statement."""
    assert drawn(Space()) == () and drawn(LOOP) == ("loop", "module")
    assert drawn(Space(workload=True)) == ("workload",) and drawn(Space(ddp_extra=("keywords",))) == ("ddp",)
    sc = _plain_loop_program()
    assert statements(sc, ()) == [] and culprit(sc, lambda alt: False, ()) is None
    # non-plain values are tried first
    sc.module["output"] = "dict"
    assert statements(sc, ("module",))[0] == ("module", "output", "dict")


def test_an_excluded_statement_is_not_drawn_again():
    from hypothesis import given, settings
    space = Space(loop=True, exclude=(("loop", "zero_grad", "set_to_none"),))
    seen = []

    @settings(max_examples=25, database=None, derandomize=True, deadline=None)
    @given(sc=scenarios(2, space))
    def draw(sc):
        seen.append(sc.loop["zero_grad"])
        assert excluded(sc, space) is None

    draw()
    assert set(seen) == {"zeros"}
    plain = _plain_loop_program()
    plain.loop["zero_grad"] = "set_to_none"
    assert excluded(plain, space) == ("loop", "zero_grad", "set_to_none")  # an explicit one is left out


@pytest.mark.cpu
@pytest.mark.long
def test_a_crash_under_one_zero_grad_mode_does_not_hide_doubling_under_the_other(conformance_session):
    """From outside: a DDP that asserts under ``zero_grad(set_to_none=True)`` and doubles the synced
    gradients under ``zero_grad(set_to_none=False)``. Before, every check failed on the crash,
    on an unshrunk 6-8 step scenario holding every drawn dimension, and the doubling went unseen;
    now the crash is shrunk, its statement excluded, and the doubling is the params verdict."""
    from conformance.cases.table import CASES
    from conformance.evaluate import evaluate
    got = {v.check: v for v in evaluate(CASES["scenario.loop"], "tests.outside.kept_grad_buffers:KeptGradBuffersDDP",
                                        "cpu", 2, conformance_session)}
    params = got["params"]
    assert params.status == "fail" and "replica" not in params.reason.split(";")[0].split(":")[0], params.reason
    assert params.example["loop"]["zero_grad"] == "zeros", params.example
    crash = "replica crash under loop zero_grad='set_to_none'"
    assert crash in params.reason and "AssertionError" in params.reason, params.reason
    others = [v for c, v in got.items() if c != "params"]
    assert others and all(v.status == "fail" and v.reason.startswith(crash) for v in others), \
        [(v.check, v.status, v.reason[:120]) for v in others]
    shrunk = others[0].example
    assert len(shrunk["steps"]) <= 2 and shrunk.get("module") is None, shrunk  # the plain module: shrunk
    assert "minimal crashing scenario" in others[0].diagnosis


def test_a_broken_world_ends_the_culprit_search():
    sc = _plain_loop_program()
    runs = []
    assert culprit(sc, lambda alt: runs.append(alt), drawn(LOOP)) is None and len(runs) == 1
