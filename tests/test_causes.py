"""conformance.report.causes: failures sharing one cause are named once (issue 26 item 2)."""
from conformance.report.causes import replica_cause, shared_cause
from conformance.verdict import Verdict

TB = ('Traceback (most recent call last):\n'
      '  File "/x/conformance/cases/train/loop.py", line 10, in train_replica\n'
      '    out = model(x)\n'
      '  File "/u/mydp/raising.py", line 30, in forward\n'
      '    raise ValueError("boom on replica 1")\n'
      'ValueError: boom on replica 1\n')


def _replicas(tb=TB, etype="ValueError", msg="boom on replica 1\nmore"):
    return [{"rank": 0, "status": "aborted-by-peer", "culprit": False},
            {"rank": 1, "status": "raised", "culprit": True, "exception_type": etype,
             "exception_message": msg, "traceback": tb}]


def _fail(case, replicas, check="param_parity", ws=2):
    return Verdict(case, check, "mod:DDP", "cpu", "mlp", ws, "fail", reason="r", replicas=replicas)


def test_replica_cause_is_type_first_line_and_raising_frame():
    assert replica_cause(_replicas()[1]) == ("ValueError", "boom on replica 1", "mydp/raising.py:30 in forward")
    assert replica_cause({"status": "died", "signal": "SIGABRT", "stacks": ""}) == ("died (SIGABRT)", "", "")
    assert replica_cause({"status": "aborted-by-peer"}) is None


def test_all_failures_with_one_cause_are_named():
    vs = [_fail(f"parity.c{i}", _replicas()) for i in range(4)]
    vs += [_fail("parity.c0", _replicas(), check="buffer_parity")]  # same case run: counted once
    vs += [Verdict("feature.x", "agreement", "mod:DDP", "cpu", "mlp", 2, "pass")]
    got = shared_cause(vs)
    assert (got.runs, got.failing) == (4, 4)
    assert got.text() == ("all 4 failing case runs share one cause: ValueError: boom on replica 1 "
                          "at mydp/raising.py:30 in forward")


def test_most_failures_sharing_a_cause_are_named_with_their_share():
    vs = [_fail(f"parity.c{i}", _replicas()) for i in range(3)]
    vs.append(_fail("parity.other", []))  # a comparison failure: no replica cause
    got = shared_cause(vs)
    assert (got.runs, got.failing) == (3, 4) and got.text().startswith("3 of 4 failing case runs")


def test_different_causes_are_not_merged():
    other = TB.replace("line 30", "line 31")
    vs = [_fail("parity.a", _replicas()), _fail("parity.b", _replicas(tb=other)),
          _fail("parity.c", _replicas(msg="another")), _fail("parity.d", _replicas(etype="KeyError"))]
    assert shared_cause(vs) is None  # four causes, none covers more than half


def test_a_single_failure_or_none_is_not_a_shared_cause():
    assert shared_cause([_fail("parity.a", _replicas())]) is None
    assert shared_cause([]) is None
    assert shared_cause([_fail(f"p.{i}", []) for i in range(3)]) is None
