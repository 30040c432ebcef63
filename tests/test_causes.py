"""conformance.report.causes: failures sharing one cause are named once (issue 26 item 2)."""
import pytest

from conformance.report.causes import replica_cause, shared_cause
from conformance.verdict import Verdict

TB = ('Traceback (most recent call last):\n'
      '  File "/x/conformance/cases/shared/loop.py", line 10, in train_replica\n'
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


@pytest.mark.cpu
@pytest.mark.long
def test_the_main_command_names_the_shared_cause_first(tmp_path):
    """The raising DDP (issue 26 item 2) through the CLI: every case still fails on its own, and
    the summary names the one cause before the verdict table."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--ddp", "tests.outside.raising_everywhere:Class",
                        "--world-size", "2", "--only", "parity.linear,parity.mlp,parity.batchnorm", "--quiet",
                        "--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if "share one cause" in ln)
    table = next(i for i, ln in enumerate(lines) if ln.startswith("case "))
    assert first < table, r.stdout[:2000]
    assert lines[first].startswith("all 3 failing case runs share one cause: ValueError: replica 1 refuses "
                                   "to run forward"), lines[first]
    assert "raising_everywhere.py" in lines[first] and "_refuse" in lines[first], lines[first]
