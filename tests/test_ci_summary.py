"""``.ci/summary.py``: what CI prints last, so a failure of the first tox environment is not
lost behind the second one's output."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.procs import REPO

pytestmark = pytest.mark.cpu
SUMMARY = f"{REPO}/.ci/summary.py"


def test_summary_names_failed_tests_and_failing_verdicts(tmp_path):
    env_tmp = tmp_path / "tox" / "cpu" / "tmp"
    env_tmp.mkdir(parents=True)
    (tmp_path / "test_x.py").write_text("def test_ok():\n    pass\n\n"
                                        "def test_bad():\n    assert 1 == 2, 'one is not two'\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_x.py"),
                    f"--junitxml={env_tmp / 'junit-1.xml'}"], cwd=tmp_path, capture_output=True, timeout=120)
    verdicts = [{"id": "parity.linear:param_parity[ref-cpu-w2]", "status": "pass", "reason": ""},
                {"id": "parity.mlp:agreement[ref-cpu-w2]", "status": "fail", "reason": "replica 1 died\nmore"},
                {"id": "feature.join:join[ref-cpu-w2]", "status": "xfail", "reason": "expected failure: x"}]
    (env_tmp / "shipped.json").write_text(json.dumps({"verdicts": verdicts}))
    (tmp_path / "tox" / "pjrt" / "tmp").mkdir(parents=True)  # nothing failed there: not printed
    out = subprocess.run([sys.executable, SUMMARY, str(tmp_path / "tox")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "=== cpu: 2 failure(s)", out.stdout
    assert any("test_x::test_bad" in x and "one is not two" in x for x in lines), out.stdout
    assert any(x.endswith("parity.mlp:agreement[ref-cpu-w2]: fail: replica 1 died") for x in lines), out.stdout
    assert not any("test_ok" in x or "parity.linear" in x or "feature.join" in x or "pjrt" in x for x in lines)
