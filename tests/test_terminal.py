"""The terminal text of a run is one more report writer (conformance.report.writers.TerminalText,
conformance.report.terminal): the last one, it prints the verdict table, the kill matrix, what the
writers before it said, where the reports are and the summary, from the run's RunOutput alone."""
import io

from conformance.report import terminal
from conformance.report.kills import KillRow
from conformance.report.text import kill_matrix_text, verdict_table
from conformance.report.writers import WRITERS, RunOutput, run_targets, write_all
from conformance.verdict import Verdict


def _verdicts():
    return [Verdict("parity.linear", "param_parity", "mine", "cpu", "linear", 2, "fail", max_dev=3e-2, atol=1e-5,
                    reason="off by 0.03", family="parity"),
            Verdict("parity.linear", "loss_parity", "mine", "cpu", "linear", 2, "pass", max_dev=1e-8, atol=1e-5,
                    family="parity")]


def _out(**extra):
    kills = [KillRow("cpu", 2, "no_grad_sync", "parity.linear",
                     [Verdict("parity.linear", "param_parity", "mutant:no_grad_sync", "cpu", "linear", 2, "fail")])]
    return RunOutput(_verdicts(), kills, {"backend": {"judged": False}, "require_supported": [], **extra},
                     repro=lambda v: f"repro {v.impl}", notes=["mine on cpu W=2: a bound"], warnings=["look"])


def test_the_terminal_text_comes_last_and_prints_what_the_others_said(tmp_path, capsys):
    assert list(WRITERS)[-1] == "terminal" and WRITERS["terminal"].run and not WRITERS["terminal"].report
    path = str(tmp_path / "r.json")
    stream = io.StringIO()
    out = _out(stopped_at="parity.linear:param_parity[mine-cpu-w2]")
    assert write_all(out, {"json": path, "failures": path, "junit": str(tmp_path / "j.xml"),
                           "terminal": stream}) == [f"failure details: {tmp_path / 'r.failures.txt'}"]
    text = stream.getvalue()
    head = (verdict_table(out.verdicts) + "\n"
            "mine on cpu W=2: a bound\n"
            "\nreproduce one failing case:\n  repro mine\n"
            "\nmutant kill matrix (every catalog mutant x every case that must kill it)\n"
            + kill_matrix_text(out.kills) + "\n"
            "\nstopped at the first failure (--exitfirst): parity.linear:param_parity[mine-cpu-w2]; later cases not run\n"
            f"failure details: {tmp_path / 'r.failures.txt'}\n"
            f"\nJSON report: {path}; JUnit XML: {tmp_path / 'j.xml'}\n"
            "1 pass, 1 fail; mutants: 1 killed, 0 survived, 0 unsupported\n"
            "coverage mine: 2 of 2 verdicts tested (100.0 %)\n")
    assert text.startswith(head), text
    tail = text[len(head):].splitlines()
    assert [line.split(":")[0] for line in tail] == ["coverage DDP surface", "coverage worlds"], tail
    assert capsys.readouterr().err == "warning: look\n"  # warnings go to stderr, above "JSON report:"


def test_json_on_stdout_and_a_backend_reported_apart():
    out = _out()
    out.verdicts.append(Verdict("collective.all_reduce", "sum", "gloo", "cpu", "-", 2, "pass", subject="backend",
                                family="collective"))
    stream = io.StringIO()
    write_all(out, {"json": io.StringIO(), "terminal": stream})
    lines = stream.getvalue().splitlines()
    assert "JSON report: stdout" in lines
    assert "backend 1 pass (reported apart: --fail-on-backend counts them)" in lines
    assert not any("stopped at" in line for line in lines)


def test_a_run_writes_the_terminal_text_to_stdout(tmp_path, capsys):
    targets = run_targets(str(tmp_path / "r.json"))
    assert targets["terminal"] == "-"
    write_all(_out(), targets)
    got = capsys.readouterr()
    assert got.out.startswith(verdict_table(_verdicts()) + "\n") and f"JSON report: {tmp_path / 'r.json'}" in got.out
    assert got.err == "warning: look\n"


def test_unmet_requirements_are_said_last():
    out = _out(require_supported=["join"])
    out.verdicts.append(Verdict("feature.join", "join", "mine", "cpu", "linear", 2, "unsupported",
                                reason="no join()\nmore", family="feature"))
    lines = terminal.summary_lines(out)
    assert lines[-1] == ("--require-supported join: 1 verdict(s) unsupported, e.g. "
                         "feature.join:join[mine-cpu-w2]: no join()")
