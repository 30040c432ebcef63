"""The CLI: bad input gives one clear line and exit code 2; a run prints the
table and writes JSON."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu


def run_cli(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("args,needle", [
    (["--runtime", "tpu"], "unknown runtime 'tpu'"),
    (["--ddp", "no_such_pkg.mod:DDP"], "cannot import 'no_such_pkg.mod'"),
    (["--ddp", "json:NoSuchClass"], "has no callable 'NoSuchClass'"),
    (["--ddp", "bogus"], "unknown DDP implementation 'bogus'"),
    (["--ddp", "mutant:nope"], "unknown mutant 'nope'"),
    (["--world-size", "1"], "world size >= 2"),
    (["--world-size", "two"], "not a comma list of integers"),
    (["--world-size", "99"], "outside 1..16"),
    (["--only", "resnet"], "unknown tag(s) resnet"),
    (["--skip", "parity,bogus"], "unknown tag(s) bogus"),
    (["--expected-failures", "/no/such/file"], "cannot read"),
    (["--profile", "huge"], "unknown profile 'huge'"),
    (["--replica-timeout", "abc"], "invalid float value"),
    (["--replica-timeout", "0"], "need seconds > 0"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--exitfirst", "--launcher", "env"], "--exitfirst: a launcher-built world"),
    (["--exitfirst-each", "--launcher", "env"], "--exitfirst-each: a launcher-built world"),
    (["--exitfirst", "--exitfirst-each"], "pick one"),
])
def test_bad_input_one_line_exit_2(args, needle):
    r = run_cli("run", *args)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_run_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    r = run_cli("run", "--runtime", "cpu", "--world-size", "2", "--ddp", "torch,ref", "--only", "parity.linear",
                "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "param_parity" in r.stdout and "6 pass, 0 fail" in r.stdout
    doc = json.loads(out.read_text())
    statuses = {(v["check"], v["impl"]): v["status"] for v in doc["verdicts"]}
    assert statuses == {(c, i): "pass" for c in ("param_parity", "loss_parity", "agreement")
                        for i in ("torch", "ref")}


def test_exitfirst_each_stops_each_implementation_at_its_first_failure(tmp_path):
    """Two DDPs in one run: the mutant stops at parity.linear (W=2, so W=3 is not run for it
    either), the reference runs every selected case at both world sizes."""
    out = tmp_path / "r.json"
    r = run_cli("run", "--ddp", "mutant:sum_not_mean,ref", "--world-size", "2,3",
                "--only", "parity.linear,parity.mlp", "--exitfirst-each", "--quiet", "--json", str(out))
    assert " fail " in r.stdout  # a failing implementation: exit 1 and fail rows in the table
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    ran = {(v["impl"], v["case"], v["world_size"]) for v in doc["verdicts"]}
    assert {(c, w) for i, c, w in ran if i == "mutant:sum_not_mean"} == {("parity.linear", 2)}
    assert {(c, w) for i, c, w in ran if i == "ref"} == {(c, w) for c in ("parity.linear", "parity.mlp")
                                                         for w in (2, 3)}
    assert list(doc["stopped_at_each"]) == ["mutant:sum_not_mean"]
    assert doc["stopped_at_each"]["mutant:sum_not_mean"].startswith("parity.linear:")


def test_exitfirst_stops_after_the_first_failing_case(tmp_path):
    """sum_not_mean fails parity.linear (the first selected case): -x stops there, exit 1."""
    out = tmp_path / "r.json"
    r = run_cli("run", "--ddp", "mutant:sum_not_mean", "--only", "parity.linear,parity.mlp", "-x",
                "--json", str(out))
    doc = json.loads(out.read_text())
    assert r.returncode == 1 and "stopped at the first failure" in r.stdout, r.stdout + r.stderr
    assert {v["case"] for v in doc["verdicts"]} == {"parity.linear"}
    assert doc["stopped_at"].startswith("parity.linear:")


def test_expected_failures_turn_fail_into_xfail_and_warn(tmp_path):
    xf = tmp_path / "xfails.txt"
    xf.write_text("# known gaps\nparity.linear:param_parity[mutant:sum_not_mean-cpu-w2]\n"
                  "parity.linear:agreement[mutant:sum_not_mean-cpu-w2]  # passes: warned\n"
                  "parity.gone:param_parity[mutant:sum_not_mean-cpu-w2]\n")
    r = run_cli("run", "--ddp", "mutant:sum_not_mean", "--world-size", "2", "--only", "parity.linear", "--expected-failures",
                str(xf), "--json", str(tmp_path / "r.json"))
    # loss_parity still fails (not listed): exit 1; the listed one is xfail
    doc = json.loads((tmp_path / "r.json").read_text())
    st = {v["check"]: v["status"] for v in doc["verdicts"]}
    assert st["param_parity"] == "xfail" and st["agreement"] == "pass", st
    assert "no longer fails" in r.stderr and "matches no verdict" in r.stderr, r.stderr
    assert r.returncode == (1 if st["loss_parity"] == "fail" else 0)


def test_unsupported_feature_is_visible_in_the_table(tmp_path):
    r = run_cli("run", "--ddp", "ref", "--only", "join", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "unsupported" in r.stdout and "has no join()" in r.stdout


def test_only_and_skip_select_by_tag(tmp_path):
    r = run_cli("run", "--ddp", "ref", "--world-size", "2", "--only", "property", "--skip", "property.allreduce_mean,"
                "property.broadcast,property.scale_linearity,property.full_batch_grad,property.rank_permutation",
                "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [v["case"] for v in doc["verdicts"]] == ["property.no_sync_accumulation"]
