"""The DDP under test and the backend beneath it are two subjects of a run.

A correct DDP written from scratch over gloo exits 0 with no flag: gloo's own finding (13) is
applied by the kit and shown in the backend's section; a failing backend verdict decides the
exit code only with ``--fail-on-backend`` or when ``--backend`` names the backend under test.
The JSON, JUnit and HTML reports carry the same split.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORRECT = "tests.outside.correct_ddp:CorrectDDP"
# one DDP case and gloo's finding-13 case: the smallest run that holds both subjects
ONLY = "collective.noncontiguous,parity.linear"
RUN_TIMEOUT_S = 600


def _run(tmp_path, *extra, only=ONLY, ddp=CORRECT):
    j = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "conformance", "run", "--runtime", "cpu", "--world-size", "2", "--quiet",
           "--ddp", ddp, "--only", only, "--json", str(j), "--junitxml", str(tmp_path / "r.xml"), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=env)
    doc = json.loads(j.read_text()) if j.exists() else None
    return r, doc


@pytest.mark.cpu
def test_a_correct_ddp_exits_0_with_no_flag_and_its_backend_section_shows_gloos_finding(tmp_path):
    r, doc = _run(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "backend gloo (cpu W=2)" in r.stdout and "finding 13" in r.stdout, r.stdout
    ddp = [v for v in doc["verdicts"] if v["subject"] == "ddp"]
    backend = [v for v in doc["verdicts"] if v["subject"] == "backend"]
    assert ddp and {v["impl"] for v in ddp} == {CORRECT} and all(v["status"] == "pass" for v in ddp)
    assert {v["impl"] for v in backend} == {"gloo"}
    assert {v["case"] for v in backend} >= {"collective.noncontiguous.all_reduce"}
    xfail = [v for v in backend if v["status"] == "xfail"]
    assert xfail and all("finding 13" in v["reason"] for v in xfail)
    assert doc["backend"]["judged"] is False and doc["backend"]["names"] == ["gloo"]
    assert "cpu-torch-2.13.txt" in doc["findings"]["applied"]
    suites = {s.get("name"): s for s in ET.parse(tmp_path / "r.xml").getroot()}
    assert set(suites) == {"conformance", "conformance-backend"}
    assert suites["conformance-backend"].find("properties/property[@name='judged']").get("value") == "false"
    assert {tc.get("classname") for tc in suites["conformance"].iter("testcase")} == {"parity.linear"}


@pytest.mark.cpu
def test_a_failing_backend_verdict_is_loud_and_exits_1_only_when_asked(tmp_path):
    # --strict-findings: gloo's finding 13 fails again, beneath a DDP that is correct
    (tmp_path / "apart").mkdir()
    r, doc = _run(tmp_path / "apart", "--strict-findings")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "does not decide the exit code" in r.stdout and " fail " in r.stdout, r.stdout
    assert sum(v["status"] == "fail" for v in doc["verdicts"] if v["subject"] == "backend") >= 4
    assert doc["findings"]["strict"] is True and not doc["findings"]["applied"]

    (tmp_path / "judged").mkdir()
    r, doc = _run(tmp_path / "judged", "--strict-findings", "--fail-on-backend")
    assert r.returncode == 1, r.stdout + r.stderr
    assert doc["backend"]["judged"] is True


@pytest.mark.cpu
def test_a_faulty_backend_under_test_fails_without_fail_on_backend(tmp_path):
    r, doc = _run(tmp_path, "--backend", "tests.outside.backends.gather_order:register",
                  only="collective.all_gather")
    assert r.returncode == 1, r.stdout + r.stderr
    bad = [v for v in doc["verdicts"] if v["status"] == "fail"]
    assert bad and all(v["subject"] == "backend" and v["case"] == "collective.all_gather" for v in bad)
    assert doc["backend"]["judged"] is True


@pytest.mark.cpu
def test_the_html_report_judges_the_ddp_and_names_the_backend_apart(tmp_path):
    pytest.importorskip("matplotlib", reason="the HTML report needs matplotlib ('.[report]')")
    from conformance.report.html import write_report
    r, doc = _run(tmp_path, "--strict-findings")
    assert r.returncode == 0, r.stdout + r.stderr
    page = Path(write_report([doc], [], str(tmp_path / "html"))["html"]).read_text()
    assert "PASS: no verdict of the 1 implementation(s) failed" in page
    assert "the backend beneath them (gloo) has" in page and ">backend gloo<" in page
    doc["backend"]["judged"] = True
    page = Path(write_report([doc], [], str(tmp_path / "html2"))["html"]).read_text()
    assert "FAIL: " in page and "backend gloo" in page.split("FAIL: ")[1][:300]


def test_a_subclass_of_torchs_ddp_fails_torchs_findings_and_is_told_so():
    """A user's class that subclasses torch's DDP inherits its defects: the verdict stays fail
    and names torch's finding; a from-scratch class or a built-in row is not told so."""
    from conformance.impls.builtin import inherits_from
    from conformance.report.expected import note_inherited, parse_expected_failures
    from conformance.verdict import Verdict
    assert inherits_from("tests.outside.transparency_named:TransparentDDP") is None
    assert inherits_from(CORRECT) is None and inherits_from("torch") is None
    assert inherits_from("tests.outside.raising_torch:RaisingTorchDDP") == "torch"
    expected = parse_expected_failures("c:param_parity[torch-cpu-w2]  # finding 12: the reducer\n", shipped=True)
    mine = [Verdict("c", "param_parity", "pkg:Mine", "cpu", "m", 2, "fail", reason="dev 1"),
            Verdict("c", "loss_parity", "pkg:Mine", "cpu", "m", 2, "fail", reason="dev 2")]
    note_inherited(mine, expected, "torch")
    assert mine[0].status == "fail" and mine[0].reason.startswith("inherited from torch, which fails it too "
                                                                  "(finding 12: the reducer")
    assert mine[1].reason == "dev 2"
