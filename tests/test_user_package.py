"""A user who only installed the kit runs the suite against their own DDP from a
scratch directory outside the repository:

    pytest --pyargs conformance --conformance-ddp userddp:MyDDP -m cpu

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
from tests.procs import script_beside_python, write_user_package

pytestmark = pytest.mark.cpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(conformance.__file__)))

USER_MODULE = '''
import torch
import ddp_impl


class MyDDP(torch.nn.parallel.DistributedDataParallel):
    """A user's DDP: torch's, subclassed (what a real package would extend)."""


class NoGradSyncDDP(torch.nn.parallel.DistributedDataParallel):
    """A broken user DDP: a comm hook that never all-reduces (each replica keeps its own)."""

    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)

        def local_only(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        super().register_comm_hook(None, local_only)
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
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance", "--conformance-world-size", "2",
                           "-m", "cpu", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_plugin_comes_from_entry_point(scratch):
    r = pytest_in(scratch, "--conformance-ddp", "userddp:MyDDP", "--collect-only")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "plugins: ddp-conformance-" in r.stdout, r.stdout[:2000]  # the pytest11 entry point
    assert f"rootdir: {scratch[0]}" in r.stdout
    assert "test_case[parity.linear-userddp:MyDDP-cpu-w2]" in r.stdout
    assert "test_mutant_killed" not in r.stdout  # the kill matrix is the kit's self-test


def test_readme_pytest_command_from_the_folder_holding_the_package(tmp_path):
    """The README's ``pytest --pyargs conformance --conformance-ddp mypkg.ddp:MyDDP -m cpu``, run
    with the ``pytest`` script (which, unlike ``python -m pytest``, does not put the current
    folder on ``sys.path``) from the folder that holds ``mypkg`` (issue 19: exit 4, "No module
    named 'mypkg'")."""
    script = script_beside_python("pytest")
    write_user_package(tmp_path, USER_MODULE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = REPO  # the kit as imported here (a checkout or site-packages); not the package's folder
    r = subprocess.run([script, "--pyargs", "conformance", "--conformance-ddp", "mypkg.ddp:MyDDP", "-m", "cpu",
                        "--conformance-world-size", "2", "--collect-only", "-q", "-p", "no:cacheprovider"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "test_case[parity.linear-mypkg.ddp:MyDDP-cpu-w2]" in r.stdout, r.stdout[-2000:]


def test_user_ddp_parity_from_scratch_dir(scratch):
    cwd, _ = scratch
    r = pytest_in(scratch, "--conformance-ddp", "userddp:MyDDP", "--conformance-only",
                  "parity.linear,parity.mlp,parity.batchnorm", "-q", "--junitxml", "junit.xml", "--conformance-json", "conformance.json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "3 passed" in r.stdout, r.stdout[-2000:]
    names = {tc.get("name") for tc in ET.parse(cwd / "junit.xml").getroot().iter("testcase")}
    assert "test_case[parity.batchnorm-userddp:MyDDP-cpu-w2]" in names, sorted(names)
    doc = json.loads((cwd / "conformance.json").read_text())
    assert doc["source"] == "pytest" and doc["pytest"]["exitstatus"] == 0
    assert {(v["case"], v["check"], v["status"]) for v in doc["verdicts"]} == {
        (f"parity.{m}", c, "pass") for m in ("linear", "mlp", "batchnorm")
        for c in ("param_parity", "loss_parity", "agreement", "transparency")
        + (("buffer_parity",) if m == "batchnorm" else ())}


@pytest.mark.long
def test_conformance_json_under_xdist(scratch):
    """Each xdist worker hands its verdicts and kill rows to the controller, which writes one file."""
    cwd, env = scratch
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--pyargs", "conformance", "-m", "cpu",
                        "--conformance-world-size", "2",
                        "-p", "no:cacheprovider", "-q", "--conformance-ddp", "userddp:MyDDP",
                        "--conformance-mutants", "--conformance-only", "parity.linear",
                        "-k", "test_case or no_grad_sync", "--conformance-json", "x.json"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 passed" in r.stdout and "mutant kill matrix" in r.stdout
    doc = json.loads((cwd / "x.json").read_text())
    assert {(v["case"], v["check"], v["status"]) for v in doc["verdicts"]} == {
        ("parity.linear", c, "pass") for c in ("param_parity", "loss_parity", "agreement", "transparency")}
    (row,) = doc["kill_matrix"]
    assert row["mutant"] == "no_grad_sync" and row["result"] == "killed"
    assert all(v["per_step"] for v in row["verdicts"] if v["check"] not in ("agreement", "transparency"))


def test_broken_user_ddp_fails_from_scratch_dir(scratch):
    r = pytest_in(scratch, "--conformance-ddp", "userddp:NoGradSyncDDP", "--conformance-only", "parity.linear", "-q")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "FAILED" in r.stdout and "test_case[parity.linear-userddp:NoGradSyncDDP-cpu-w2]" in r.stdout
    assert "param_parity" in r.stdout


def test_plugin_has_no_side_effects_on_other_projects(tmp_path):
    """The entry point loads into every project's pytest: an unrelated project with its
    own Hypothesis profile name and options of its own must run untouched."""
    proj = tmp_path / "other"
    proj.mkdir()
    (proj / "conftest.py").write_text(
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--runtime', default='x')\n"  # names the kit used to take
        "    parser.addoption('--ddp', default='y')\n"
        "    parser.addoption('--world-size', default='z')\n")
    (proj / "test_other.py").write_text(
        "from hypothesis import given, strategies as st\n\n"
        "@given(st.integers())\n"
        "def test_ints(x):\n    assert isinstance(x, int)\n\n"
        "def test_cpu_marker_is_not_ours(pytestconfig):\n"
        "    assert pytestconfig.getoption('--runtime') == 'x'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["HYPOTHESIS_PROFILE"] = "myprofile"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=proj, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 passed" in r.stdout
    assert "conformance" not in (r.stdout + r.stderr).replace("ddp-conformance", ""), r.stdout


def _kit_env(*paths):
    """The environment of a user's shell, with this checkout's kit first on the path (the
    installed distribution supplies the pytest11 entry point; its code may be another copy)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), REPO])
    return env


def test_pytest_script_finds_a_package_in_the_current_folder(tmp_path):
    """The README's ``pytest --pyargs conformance --conformance-ddp mypkg.ddp:MyDDP`` from the
    folder holding ``mypkg``: the ``pytest`` script (unlike ``python -m pytest``) does not put
    that folder on sys.path; the plugin does, and the spawned replicas inherit it."""
    script = script_beside_python("pytest")
    write_user_package(tmp_path, USER_MODULE)
    r = subprocess.run([script, "--pyargs", "conformance", "--conformance-ddp", "mypkg.ddp:MyDDP", "-m", "cpu",
                        "--conformance-world-size", "2", "--conformance-only", "parity.linear", "-q",
                        "-p", "no:cacheprovider", "-rA"],
                       cwd=tmp_path, env=_kit_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PASSED" in r.stdout and "test_case[parity.linear-mypkg.ddp:MyDDP-cpu-w2]" in r.stdout, r.stdout[-2000:]


def test_plugin_expected_failures_take_case_entries_and_warn_once(scratch, tmp_path):
    """A case entry (not only a full verdict id) makes a failing test xfail; an entry that
    matches nothing is one warning in the session summary."""
    cwd, _ = scratch
    xf = tmp_path / "known.txt"
    xf.write_text("parity.linear   # no gradient sync\nparity.gone:agreement\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "conformance", "--conformance-world-size", "2",
                        "-m", "cpu", "-p", "no:cacheprovider", "-q", "--conformance-ddp", "userddp:NoGradSyncDDP",
                        "--conformance-only", "parity.linear", "--conformance-expected-failures", str(xf)],
                       cwd=cwd, env=_kit_env(tmp_path / "userpkg"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 xfailed" in r.stdout, r.stdout[-2000:]
    assert r.stdout.count("warning: expected failure parity.gone:agreement matches no verdict of this run") == 1
    assert "warning: expected failure parity.linear" not in r.stdout
