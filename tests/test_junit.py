"""``run --junitxml``: one testcase per verdict id, pytest's element for each status
(conformance.report.junit)."""
import xml.etree.ElementTree as ET

from conformance.outcome import repro_command
from conformance.report.junit import build_junit, write_junit
from conformance.report.kills import KillRow
from conformance.verdict import Verdict


def _v(status, check="param_parity", case="parity.linear", impl="mypkg.ddp:MyDDP", reason="why", diagnosis=""):
    return Verdict(case=case, check=check, impl=impl, runtime="cpu", model="linear", world_size=2,
                   status=status, reason=reason, diagnosis=diagnosis)


def _cases(root):
    return {(tc.get("classname"), tc.get("name")): tc for tc in root.iter("testcase")}


def test_one_testcase_per_verdict_with_the_status_as_pytest_writes_it():
    vs = [_v("pass", "agreement"), _v("fail", reason="max dev 3 > atol 1", diagnosis="replica 1 said \x07 hi"),
          _v("vacuous", "loss_parity", reason="barely moved"), _v("unsupported", "buffer_parity", reason="no join()"),
          _v("skip", "grad", reason="needs 2 hosts"), _v("xfail", "after", case="feature.no_sync",
                                                          reason="expected failure: max dev")]
    root = build_junit(vs, seconds={("parity.linear", "mypkg.ddp:MyDDP", "cpu", 2): 10.0}).getroot()
    got = _cases(root)
    assert len(got) == len(vs) == int(root.get("tests"))
    assert set(got) == {(v.case, f"{v.check}[{v.impl}-{v.runtime}-w{v.world_size}]") for v in vs}
    assert all(f"{c}:{n}" in {v.id for v in vs} for c, n in got)  # classname:name is the verdict id
    assert list(got["parity.linear", "agreement[mypkg.ddp:MyDDP-cpu-w2]"]) == []  # pass: no child
    fail = got["parity.linear", "param_parity[mypkg.ddp:MyDDP-cpu-w2]"].find("failure")
    assert fail.get("type") == "fail" and fail.get("message") == "max dev 3 > atol 1"
    assert "replica 1 said ? hi" in fail.text  # control characters are not valid XML
    assert fail.text.rstrip().endswith("reproduce: " + repro_command(vs[1]))
    vac = got["parity.linear", "loss_parity[mypkg.ddp:MyDDP-cpu-w2]"].find("failure")
    assert vac.get("type") == "vacuous" and "reproduce: python -m conformance run" in vac.text
    for name, kind, msg in (("buffer_parity", "unsupported", "no join()"), ("grad", "skip", "needs 2 hosts")):
        sk = got["parity.linear", f"{name}[mypkg.ddp:MyDDP-cpu-w2]"].find("skipped")
        assert (sk.get("type"), sk.get("message")) == (kind, msg)
    xf = got["feature.no_sync", "after[mypkg.ddp:MyDDP-cpu-w2]"].find("skipped")
    assert xf.get("type") == "pytest.xfail" and xf.get("message") == "expected failure: max dev"
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("6", "2", "0", "3")
    # the case's 10 s shared by its 5 verdicts
    assert got["parity.linear", "agreement[mypkg.ddp:MyDDP-cpu-w2]"].get("time") == "2.000"


def test_kill_matrix_suite_and_interrupted_property(tmp_path):
    rows = [KillRow("cpu", 2, "sum_not_mean", "parity.linear", [_v("fail", impl="mutant:sum_not_mean")]),
            KillRow("cpu", 2, "no_grad_sync", "parity.mlp", [_v("pass", impl="mutant:no_grad_sync")]),
            KillRow("cpu", 2, "drop_join", "feature.join", [_v("unsupported", reason="no join()")])]
    path = tmp_path / "j.xml"
    write_junit(str(path), [_v("pass")], rows, interrupted="SIGTERM")
    root = ET.parse(path).getroot()  # well-formed on disk
    kills = root.findall("testsuite")[1]
    assert kills.get("name") == "conformance-kill-matrix"
    got = _cases(kills)
    assert list(got["mutant.sum_not_mean", "parity.linear[cpu-w2]"]) == []
    assert got["mutant.no_grad_sync", "parity.mlp[cpu-w2]"].find("failure").get("type") == "survived"
    assert got["mutant.drop_join", "feature.join[cpu-w2]"].find("skipped").get("message") == "no join()"
    assert {p.get("name"): p.get("value") for p in root.iter("property")} == {"interrupted": "SIGTERM"}
    assert root.get("tests") == "4" and root.get("failures") == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["j.xml"]  # no temporary file left


def test_a_junit_parser_reads_the_file_back(tmp_path):
    """CI systems read the file with JUnit parsers, not ElementTree: junitparser (what many CI
    plugins build on) must see the same testcases and results."""
    junitparser = __import__("pytest").importorskip("junitparser", reason="junitparser is a test dependency "
                                                     "(pip install -e '.[test]')")
    vs = [_v("pass", "agreement"), _v("fail", reason="max dev 3 > atol 1"), _v("vacuous", "loss_parity"),
          _v("unsupported", "buffer_parity", reason="no join()"), _v("xfail", "after", case="feature.no_sync")]
    path = tmp_path / "j.xml"
    write_junit(str(path), vs, [])
    xml = junitparser.JUnitXml.fromfile(str(path))
    cases = {(c.classname, c.name): c for suite in xml for c in suite}
    assert set(cases) == {(v.case, f"{v.check}[{v.impl}-{v.runtime}-w{v.world_size}]") for v in vs}
    kinds = {k: [type(r).__name__ for r in c.result] for k, c in cases.items()}
    assert kinds[("parity.linear", "agreement[mypkg.ddp:MyDDP-cpu-w2]")] == []
    assert kinds[("parity.linear", "param_parity[mypkg.ddp:MyDDP-cpu-w2]")] == ["Failure"]
    assert kinds[("parity.linear", "loss_parity[mypkg.ddp:MyDDP-cpu-w2]")] == ["Failure"]
    assert kinds[("parity.linear", "buffer_parity[mypkg.ddp:MyDDP-cpu-w2]")] == ["Skipped"]
    assert kinds[("feature.no_sync", "after[mypkg.ddp:MyDDP-cpu-w2]")] == ["Skipped"]
    suite = next(iter(xml))
    assert (suite.tests, suite.failures, suite.skipped) == (5, 2, 2)
