"""The verdict -> outcome mapping every face uses (conformance.outcome)."""
import math
import shlex

import pytest

from conformance.outcome import outcome, repro_command
from conformance.verdict import STATUSES, Verdict


def _v(status, check="param_parity", impl="mypkg.ddp:My DDP", reason="why"):
    return Verdict(case="parity.linear", check=check, impl=impl, runtime="cpu", model="linear",
                   world_size=3, status=status, reason=reason, max_dev=math.nan, atol=math.nan)


@pytest.mark.parametrize("statuses, kind", [
    (["pass", "pass"], "pass"),
    (["pass", "fail"], "fail"),
    (["pass", "vacuous"], "fail"),
    (["xfail", "pass"], "xfail"),
    (["xfail", "fail"], "fail"),
    (["unsupported", "unsupported"], "skip"),
    (["skip", "unsupported"], "skip"),
    (["unsupported", "pass"], "pass"),
])
def test_outcome_table(statuses, kind):
    assert set(statuses) <= set(STATUSES)
    assert outcome([_v(s) for s in statuses]).kind == kind


def test_a_failure_names_the_command_that_reproduces_it():
    msg = outcome([_v("fail")]).message
    line = msg.splitlines()[-1]
    assert line.startswith("reproduce: ")
    assert shlex.split(line[len("reproduce: "):]) == [
        "python", "-m", "conformance", "run", "--ddp", "mypkg.ddp:My DDP", "--runtime", "cpu",
        "--world-size", "3", "--only", "parity.linear"]
    assert repro_command(_v("fail")) in msg


def test_no_verdicts_is_an_error_not_a_pass():
    with pytest.raises(ValueError):
        outcome([])


def test_the_repro_command_keeps_a_non_default_timeout_and_profile():
    from conformance.settings import Settings
    v = _v("fail")
    assert "--replica-timeout" not in repro_command(v, Settings())
    cmd = shlex.split(repro_command(v, Settings(replica_timeout=10.0, profile="ci")))
    assert cmd[-4:] == ["--replica-timeout", "10", "--profile", "ci"]

