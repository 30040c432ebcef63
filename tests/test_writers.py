"""Report writers behind one interface (issue 28 item 3): the run, replay, the pytest face and
the report command write through conformance.report.writers; a run's JSON converts to the other
formats; a new format is its Writer class and one registration (docs/extending.md)."""
import json
import subprocess
import sys

import pytest

from conformance import cli
from conformance.cli import report as report_cli
from conformance.report import writers
from conformance.report.writers import WRITERS, RunOutput, Writer, register, run_targets, write_all
from conformance.settings import Settings
from conformance.verdict import Verdict


def _out():
    return RunOutput([Verdict("parity.linear", "param_parity", "mine", "cpu", "linear", 2, "fail", reason="off by 1",
                              diagnosis="see SCENARIO.json")])


def test_every_format_is_one_writer_in_the_order():
    assert list(WRITERS) == ["scenarios", "json", "failures", "junit", "html", "terminal"]  # the order they write in
    assert writers.report_formats() == ("html", "json", "failures", "junit")
    assert {n for n, w in WRITERS.items() if w.run} == {"scenarios", "json", "failures", "junit", "terminal"}
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


def test_run_targets_come_from_the_writers(tmp_path):
    opts = cli.RunOptions(json=str(tmp_path / "r.json"), junitxml=str(tmp_path / "j.xml"))
    assert run_targets(opts.json, None, opts) == {"scenarios": opts.json, "json": opts.json,
                                                  "failures": opts.json, "junit": opts.junitxml, "terminal": "-"}
    stream = object()
    assert run_targets("-", stream, cli.RunOptions(json="-")) == {"scenarios": "-", "json": stream, "failures": "-",
                                                                  "terminal": "-"}


class ToyWriter(Writer):
    """A report format that exists only in this test: one line per verdict."""

    name = "toy"
    suffix = ".toy.txt"
    run = report = True
    says = "one line per verdict"

    def write(self, out):
        with open(self.target, "w") as f:
            f.write("".join(f"{v.id} {v.status}\n" for v in out.verdicts))
        return [f"toy: {self.target}"]


@pytest.fixture
def toy():
    register(ToyWriter)  # the one registration line a new format needs
    try:
        yield ToyWriter
    finally:
        WRITERS.pop(ToyWriter.name)


def test_a_new_format_is_its_writer_and_one_registration(toy, tmp_path, capsys):
    # write_all writes it, after the built-in file formats and before the terminal text
    assert list(WRITERS)[-2:] == ["toy", "terminal"]
    out = _out()
    lines = write_all(out, {"json": str(tmp_path / "r.json"), "toy": str(tmp_path / "r.toy.txt")})
    assert lines == [f"toy: {tmp_path / 'r.toy.txt'}"]
    assert (tmp_path / "r.toy.txt").read_text() == "parity.linear:param_parity[mine-cpu-w2] fail\n"
    # a run writes it beside its JSON report (not with --json -)
    assert run_targets(str(tmp_path / "r.json"))["toy"] == str(tmp_path / "r.toy.txt")
    assert "toy" not in run_targets("-", object())
    # python -m conformance report offers it (--format choices and help) and writes report<suffix>
    parser = cli.build_parser()
    report_parser = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith(" report"))
    fmt = next(a for a in report_parser._actions if "--format" in a.option_strings)
    assert fmt.choices[-1] == "toy" and fmt.help.endswith("junit (XML) or toy (one line per verdict), "
                                                          "written by the same writers as run")
    args = parser.parse_args(["report", "--json", str(tmp_path / "r.json"), "--out", str(tmp_path / "o"),
                              "--format", "toy"])
    assert args.format == "toy"
    assert report_cli.command(Settings.from_env(), json=args.json, calibration=[], out=args.out,
                              format=args.format) == 0
    assert (tmp_path / "o" / "report.toy.txt").read_text() == "parity.linear:param_parity[mine-cpu-w2] fail\n"
    assert capsys.readouterr().out == f"toy: {tmp_path / 'o' / 'report.toy.txt'}\n"


def test_a_taken_name_is_refused():
    class Again(Writer):
        name = "json"
    with pytest.raises(ValueError, match="empty or taken"):
        register(Again)
    assert WRITERS["json"] is writers.JsonReport


def test_the_pytest_face_writes_its_json_through_the_writers(tmp_path, monkeypatch):
    import conformance.plugin as plugin
    seen = []
    real = writers.write_all
    monkeypatch.setattr(writers, "write_all", lambda out, targets: seen.append(targets) or real(out, targets))

    class Config:
        stash = {plugin._VERDICTS: _out().verdicts, plugin._KILLS: []}
        invocation_params = type("P", (), {"args": ("-q",)})
    monkeypatch.setattr(plugin, "_opt", lambda config, key: str(tmp_path / "face.json") if key == "json" else None)
    plugin.pytest_sessionfinish(type("S", (), {"config": Config()}), 0)
    assert seen == [{"json": str(tmp_path / "face.json")}]
    doc = json.loads((tmp_path / "face.json").read_text())
    assert doc["source"] == "pytest" and doc["pytest"] == {"exitstatus": 0, "args": ["-q"]}
    assert [v["status"] for v in doc["verdicts"]] == ["fail"]
