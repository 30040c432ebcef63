"""A user who only installed the kit runs the suite against their own DDP from a
scratch directory outside the repository:

    pytest --pyargs conformance.tests.test_parity --ddp userddp:MyDDP -m cpu

The plugin must come from the ``pytest11`` entry point (not the repository's
conftest), ids must be readable in JUnit XML, ``--conformance-json`` must write
the run report; a DDP that never syncs gradients must fail.
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import conformance

pytestmark = pytest.mark.cpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(conformance.__file__)))

USER_MODULE = '''
import torch
import ddp_impl


class MyDDP(torch.nn.parallel.DistributedDataParallel):
    """A user's DDP: torch's, subclassed (what a real package would extend)."""


class NoGradSyncDDP(ddp_impl.DistributedDataParallel):
    """A broken user DDP: gradients are never all-reduced."""

    def _reduce_bucket(self, bucket):
        return None
'''


@pytest.fixture
def scratch(tmp_path):
    pkg, cwd = tmp_path / "userpkg", tmp_path / "work"
    pkg.mkdir()
    cwd.mkdir()
    (pkg / "userddp.py").write_text(USER_MODULE)
    assert not str(cwd).startswith(REPO + os.sep)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(pkg)  # the user's package only: the kit comes from site-packages
    return cwd, env


def pytest_in(scratch, *args, timeout=600):
    cwd, env = scratch
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance.tests.test_parity",
                           "-m", "cpu", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_plugin_comes_from_entry_point(scratch):
    r = pytest_in(scratch, "--ddp", "userddp:MyDDP", "--collect-only")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "plugins: ddp-conformance-" in r.stdout, r.stdout[:2000]  # the pytest11 entry point
    assert f"rootdir: {scratch[0]}" in r.stdout
    assert "test_check[param_parity-linear-userddp:MyDDP-cpu-w2]" in r.stdout


def test_user_ddp_passes_from_scratch_dir(scratch):
    cwd, _ = scratch
    r = pytest_in(scratch, "--ddp", "userddp:MyDDP", "-q", "--junitxml", "junit.xml",
                  "--conformance-json", "conformance.json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "7 passed" in r.stdout, r.stdout[-2000:]
    names = {tc.get("name") for tc in ET.parse(cwd / "junit.xml").getroot().iter("testcase")}
    assert "test_check[param_parity-linear-userddp:MyDDP-cpu-w2]" in names, sorted(names)
    assert "test_check[buffer_parity-batchnorm-userddp:MyDDP-cpu-w2]" in names, sorted(names)
    doc = json.loads((cwd / "conformance.json").read_text())
    assert doc["source"] == "pytest" and doc["pytest"]["exitstatus"] == 0
    assert {(v["check"], v["model"], v["impl"], v["status"]) for v in doc["verdicts"]} == {
        (c, m, "userddp:MyDDP", "pass") for c, m in [
            ("param_parity", "linear"), ("loss_parity", "linear"), ("param_parity", "mlp"),
            ("loss_parity", "mlp"), ("param_parity", "batchnorm"), ("loss_parity", "batchnorm"),
            ("buffer_parity", "batchnorm")]}
    assert all(len(v["per_step"]) > 0 for v in doc["verdicts"])


def test_conformance_json_under_xdist(scratch):
    """Each xdist worker hands its verdicts and kill rows to the controller, which writes one file."""
    cwd, env = scratch
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--pyargs", "conformance.tests.test_parity",
                        "conformance.tests.test_mutants", "-m", "cpu", "-p", "no:cacheprovider", "-q",
                        "--ddp", "userddp:MyDDP", "-k", "param_parity-linear or no_grad_sync",
                        "--conformance-json", "x.json"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 passed" in r.stdout and "mutant kill matrix" in r.stdout
    doc = json.loads((cwd / "x.json").read_text())
    assert [(v["check"], v["model"], v["status"]) for v in doc["verdicts"]] == [("param_parity", "linear", "pass")]
    (row,) = doc["kill_matrix"]
    assert row["mutant"] == "no_grad_sync" and row["cells"]["param_parity"] == "KILL"
    assert len(row["verdicts"]) == 7 and all(v["per_step"] for v in row["verdicts"])


def test_broken_user_ddp_fails_from_scratch_dir(scratch):
    r = pytest_in(scratch, "--ddp", "userddp:NoGradSyncDDP", "-q")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "failed" in r.stdout and "param_parity" in r.stdout
    assert "FAILED" in r.stdout and "test_check[param_parity-linear-userddp:NoGradSyncDDP-cpu-w2]" in r.stdout
