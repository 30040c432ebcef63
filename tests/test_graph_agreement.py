"""graph_agreement (issue 26, item 4): replicas of an XLA DDP build one step graph under torch_xla's
default graph rules, or the verdict names the step, the replica and the first differing HLO op
(conformance.cases.task.graphs)."""
import pytest

from conformance.cases.task.graphs import first_difference, hlo_ops, judge_graph_agreement, user_of
from conformance.cases.table import CASES
from conformance.evaluate import evaluate
from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime

HLO = """HloModule IrToHlo.14, entry_computation_layout={(f32[3,2]{1,0})->(f32[3,2]{1,0})}

ENTRY %IrToHlo.14 (p0.2: f32[3,2]) -> (f32[3,2]) {
  %p0.2 = f32[3,2]{1,0} parameter(0)
  %constant.1 = f32[] constant(@C@), metadata={op_type="aten__mul"}
  %broadcast.3 = f32[3,2]{1,0} broadcast(f32[] %constant.1), dimensions={}
  %multiply.4 = f32[3,2]{1,0} multiply(f32[3,2]{1,0} %p0.2, f32[3,2]{1,0} %broadcast.3)
  ROOT %tuple.13 = (f32[3,2]{1,0}) tuple(f32[3,2]{1,0} %multiply.4)
}
"""


def test_the_first_differing_op_and_its_reader_are_named():
    a, b = hlo_ops(HLO.replace("@C@", "1")), hlo_ops(HLO.replace("@C@", "0"))
    assert len(a) == 5 and a[1] == "%constant.1 = f32[] constant(1)", a  # metadata dropped
    i, x, y = first_difference(a, b)
    assert (i, x, y) == (1, "%constant.1 = f32[] constant(1)", "%constant.1 = f32[] constant(0)")
    assert user_of(b, i).startswith("%broadcast.3 = ")
    assert first_difference(a, a)[0] == -1
    assert first_difference(a, a[:3])[1:] == (a[3], "(none)")


def test_graph_agreement_verdicts():
    skip = judge_graph_agreement([{"skip": "runtime cpu builds no per-replica XLA graphs"}] * 2, "ref", "cpu")
    assert [(v.status, v.reason) for v in skip] == [("skip", "runtime cpu builds no per-replica XLA graphs")]
    ok = judge_graph_agreement([{"hashes": ["a", "b"], "difference": None}] * 2, "ref", "pjrt")
    assert [v.status for v in ok] == ["pass"]
    diff = {"step": 2, "replica": 1, "index": 7, "replica0_op": "%c = f32[] constant(1)",
            "replica_op": "%c = f32[] constant(0)", "used_by": "%m = multiply(%x, %c)", "ops": 40, "hashes": ["a", "b"]}
    (bad,) = judge_graph_agreement([{"hashes": ["a"], "difference": diff}] * 2, "ref", "pjrt")
    assert (bad.status, bad.replica, bad.first_bad_step) == ("fail", 1, 2)
    assert bad.reason.startswith("replicas compiled different graphs at step 2: replica 1's graph differs "
                                 "from replica 0's at op 7 of 40: '%c = f32[] constant(0)' (replica 1)"), bad.reason


def _pjrt(w):
    try:
        get_runtime("pjrt").check(w)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")


XLA_DDPS = "tests.outside.xla_graphs"


@pytest.mark.pjrt
def test_a_rank_dependent_python_constant_fails_graph_agreement_with_right_arithmetic(conformance_session):
    """The mask of a hand-rolled broadcast as a Python 1.0 / 0.0: parity passes (the kit's own
    graph rules hide it), graph_agreement fails naming replica 1 and the constant; the sibling with
    the mask on the device as data, and the reference DDP, pass."""
    _pjrt(2)
    case = CASES["feature.graph_agreement"]
    (bad,) = evaluate(case, f"{XLA_DDPS}:XlaPythonMaskBroadcastDDP", "pjrt", 2, conformance_session)
    assert bad.status == "fail" and bad.replica == 1, (bad.status, bad.reason)
    assert "replicas compiled different graphs at DDP construction" in bad.reason, bad.reason
    assert "constant(0)' (replica 1) vs" in bad.reason and "constant(1)' (replica 0)" in bad.reason, bad.reason
    for good in (f"{XLA_DDPS}:XlaMaskBroadcastDDP", "ref"):
        (v,) = evaluate(case, good, "pjrt", 2, conformance_session)
        assert v.status == "pass", (good, v.status, v.reason)
    parity = evaluate(CASES["parity.batchnorm"], f"{XLA_DDPS}:XlaPythonMaskBroadcastDDP", "pjrt", 2,
                      conformance_session)
    assert [v.status for v in parity] == ["pass"] * len(parity), [(v.check, v.status, v.reason) for v in parity]


def test_own_graphs_are_worded_as_the_cause():
    from conformance.worlds.runtimes.pjrt_graphs import describe
    assert describe([{"rank": 0}, {"rank": 1}]) == ""
    g = {"task": 3, "count": 2, "at": "ddp.py:80 in _on_grad", "step": 1, "phase": "backward",
         "collective": "xla::cross_replica_sum"}
    text = describe([{"rank": 0, "own_graphs": g}, {"rank": 1}])
    assert text.startswith("replicas compiled different graphs: replica 0 cut 2 graph(s) itself, the first at "
                           "ddp.py:80 in _on_grad (step 1, phase backward), first op that must meet the others: "
                           "xla::cross_replica_sum"), text
    assert "replica 1" not in text


@pytest.mark.pjrt
def test_a_sync_inside_backward_dies_with_replicas_compiled_different_graphs(conformance_session):
    """torch_xla.sync() in a gradient hook: each replica compiles its own graph, XLA aborts the host
    in the all-reduce; the verdict leads with the cause, where it was called and the collective."""
    _pjrt(2)
    verdicts = evaluate(CASES["parity.linear"], f"{XLA_DDPS}:XlaSyncInBackwardDDP", "pjrt", 2, conformance_session)
    v = verdicts[0]
    assert v.status == "fail", (v.status, v.reason)
    assert v.reason.startswith("replicas compiled different graphs: replica 0 cut "), v.reason
    assert "xla_graphs.py:" in v.reason and "in _on_grad (step 1, phase backward)" in v.reason, v.reason
    assert "xla::cross_replica_sum" in v.reason and "died" in v.reason, v.reason
