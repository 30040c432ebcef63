"""Process subgroups (``feature.subgroups``): the group layout, verdicts naming the group and
its global ranks, and the case on a CPU world of 4 (two groups of two)."""
import pytest

from conformance.cases.table import CASES
from conformance.cases.train.kind import in_group, worst
from conformance.cases.shared.setups import SETUPS, replica_groups
from conformance.evaluate import evaluate
from conformance.verdict import Verdict


def test_groups_are_consecutive_pairs_and_the_default_is_one_job():
    assert SETUPS["process_groups"].groups(4) == [[0, 1], [2, 3]]
    assert SETUPS["process_groups"].groups(3) == [[0, 1], [2]]
    assert replica_groups(("process_groups",), 4) == [[0, 1], [2, 3]]
    assert replica_groups((), 3) == [[0, 1, 2]]


def _fail(reason, diagnosis="", replica=1, margin=1e-3):
    return Verdict("feature.subgroups", "agreement", "ref", "cpu", "linear", 2, "fail", reason=reason,
                   diagnosis=diagnosis, replica=replica, margin=margin)


def test_a_group_verdict_names_the_group_and_global_ranks():
    v = in_group(_fail("replica 1's 'weight' differs from replica 0's by 0.1 from step 1. "
                       "Replicas 0, 1 are out of bound there.", "  replica 1:\n    'weight': ..."), [2, 3], 4)
    assert v.reason == ("process group [2, 3]: replica 3's 'weight' differs from replica 2's by 0.1 from "
                        "step 1. Replicas 2, 3 are out of bound there.")
    assert v.diagnosis.startswith("process group [2, 3]:\n  replica 3:")
    assert (v.replica, v.world_size) == (3, 4)
    alone = in_group(_fail("'weight' deviates", replica=None), [2], 3)
    assert alone.replica == 2 and alone.reason == "process group [2]: 'weight' deviates"


def test_the_worst_group_decides():
    ok = Verdict("c", "param_parity", "ref", "cpu", "linear", 4, "pass", margin=600.0)
    bad = _fail("x", margin=1e-4)
    assert worst([ok, bad]) is bad
    assert worst([ok, Verdict("c", "param_parity", "ref", "cpu", "linear", 4, "vacuous")]).status == "vacuous"


@pytest.mark.cpu
def test_subgroups_at_w4_pass_for_ref_and_kill_both_mutants(conformance_session):
    case = CASES["feature.subgroups"]
    assert {v.status for v in evaluate(case, "ref", "cpu", 4, conformance_session)} == {"pass"}
    div = {v.check: v for v in evaluate(case, "mutant:group_sum_global_divide", "cpu", 4, conformance_session)}
    assert div["param_parity"].status == "fail" and div["param_parity"].reason.startswith("process group [0, 1]")
    bc = {v.check: v for v in evaluate(case, "mutant:broadcast_global_rank0", "cpu", 4, conformance_session)}
    assert bc["param_parity"].status == "fail"
    assert bc["param_parity"].reason.startswith("process group [2, 3]: replica 2's")
    assert bc["agreement"].status == "pass"  # within each group the replicas still agree


@pytest.mark.pjrt
def test_subgroups_on_pjrt_run_on_xla_replica_groups(conformance_session):
    """W=4: XlaCollectives(groups=[[0, 1], [2, 3]]) (xm.all_reduce / xm.all_gather groups=);
    W=3 (groups of 2 + 1) is unsupported: torch_xla needs equal group sizes."""
    from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime
    try:
        get_runtime("pjrt").check(4)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")
    case = CASES["feature.subgroups"]
    assert {v.status for v in evaluate(case, "ref", "pjrt", 4, conformance_session)} == {"pass"}
    bc = {v.check: v for v in evaluate(case, "mutant:broadcast_global_rank0", "pjrt", 4, conformance_session)}
    assert bc["param_parity"].status == "fail" and bc["param_parity"].reason.startswith("process group [2, 3]")
    (why,) = {v.reason for v in evaluate(case, "ref", "pjrt", 3, conformance_session)}
    assert "equal sizes" in why
