"""Report writers behind one interface (issue 28 item 3): the run, replay and the report
command write through conformance.report.writers; a run's JSON converts to the other formats."""
import json
import subprocess
import sys

import pytest

from conformance.report.writers import ORDER, WRITERS, RunOutput, write_all
from conformance.verdict import Verdict


def _out():
    return RunOutput([Verdict("parity.linear", "param_parity", "mine", "cpu", "linear", 2, "fail", reason="off by 1",
                              diagnosis="see SCENARIO.json")])


def test_every_format_is_one_writer_in_the_order():
    assert set(WRITERS) == set(ORDER) == {"scenarios", "json", "failures", "junit", "html"}
    with pytest.raises(ValueError, match="unknown report writer"):
        write_all(_out(), {"pdf": "x"})


def test_json_failures_and_junit_from_one_output(tmp_path):
    out = _out()
    lines = write_all(out, {"json": str(tmp_path / "r.json"), "failures": str(tmp_path / "r.json"),
                            "junit": str(tmp_path / "j.xml")})
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["verdicts"][0]["status"] == "fail" and out.doc["created"] == doc["created"]
    text = (tmp_path / "r.failures.txt").read_text()
    assert "=== parity.linear:param_parity[mine-cpu-w2]: fail: off by 1" in text and "expected: " in text
    assert lines == [f"failure details: {tmp_path / 'r.failures.txt'}"]
    assert 'timestamp="' + doc["created"][:10] in (tmp_path / "j.xml").read_text()


@pytest.mark.parametrize("fmt,name,needle", [("junit", "junit.xml", "<testsuites"),
                                            ("failures", "report.failures.txt", "=== parity.linear"),
                                            ("json", "report.json", '"verdicts"')])
def test_report_command_converts_a_run(tmp_path, fmt, name, needle):
    out = _out()
    write_all(out, {"json": str(tmp_path / "run.json")})
    r = subprocess.run([sys.executable, "-m", "conformance", "report", "--json", str(tmp_path / "run.json"),
                        "--format", fmt, "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert needle in (tmp_path / "o" / name).read_text()
