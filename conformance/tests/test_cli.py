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
    (["--models", "resnet"], "unknown model 'resnet'"),
])
def test_bad_input_one_line_exit_2(args, needle):
    r = run_cli("run", *args)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_run_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    r = run_cli("run", "--runtime", "cpu", "--ddp", "torch,ref", "--models", "linear",
                "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "param_parity" in r.stdout and "4 pass, 0 fail" in r.stdout
    doc = json.loads(out.read_text())
    statuses = {(v["check"], v["impl"]): v["status"] for v in doc["verdicts"]}
    assert statuses == {(c, i): "pass" for c in ("param_parity", "loss_parity") for i in ("torch", "ref")}


def test_failing_implementation_exits_1(tmp_path):
    r = run_cli("run", "--ddp", "mutant:sum_not_mean", "--models", "linear", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 1 and " fail " in r.stdout
