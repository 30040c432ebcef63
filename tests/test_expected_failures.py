"""The kit's findings files (conformance/report/findings/: the known failures of torch's DDP, its
shipped paths, torch_xla's rows and the backends beneath them, which every run applies) cannot
rot silently: every line names a verdict id that exists - a case of the table, a check that
case reports, an implementation row, a runtime, a world size >= 2 - and a finding of
docs/findings.md in its comment.

The CLI itself only warns about shipped ids that no longer fail (conformance.report.expected), so
a renamed case or check would otherwise leave a dead line behind.
"""
import pathlib
import re

import pytest

from conformance.report.findings import FILES, FOLDER

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
PATHS = [FOLDER / f.name for f in FILES]
# conformance.verdict.Verdict.id: <case>:<check>[<impl>-<runtime>-w<W>]
VERDICT_ID = re.compile(r"^(?P<case>[^:\s]+):(?P<check>[^\[\s]+)"
                        r"\[(?P<impl>\S+)-(?P<runtime>[a-z]+)-w(?P<w>\d+)\]$")


def finding_names(text: str) -> tuple[set, set]:
    """Numbered findings (``## N. title``) and bold bullet titles (``* **title**``) of findings.md."""
    numbers = set(re.findall(r"^## (\d+)\. ", text, re.M))
    titles = set(re.findall(r"^\* \*\*(.+?)\*\*", text, re.M))
    return numbers, titles


def problems(lines, findings_md: str) -> list[str]:
    """Every reason a line of an expected-failures file is dead or unexplained."""
    from conformance.cases.kinds import REGISTRY
    from conformance.cases.table import CASES
    from conformance.impls.builtin import IMPLS
    from conformance.worlds.runtimes import RUNTIMES
    numbers, titles = finding_names(findings_md)
    out = []
    for n, line in enumerate(lines, 1):
        vid, _, comment = (s.strip() for s in line.partition("#"))
        if not vid:
            continue
        m = VERDICT_ID.match(vid)
        if not m:
            out.append(f"line {n}: {vid!r} is not a verdict id <case>:<check>[<impl>-<runtime>-w<W>]")
            continue
        case = CASES.get(m["case"])
        if case is None:
            out.append(f"line {n}: no case {m['case']!r}")
        elif m["check"] not in case.checks:
            out.append(f"line {n}: case {case.name} reports no check {m['check']!r} "
                       f"({', '.join(case.checks)})")
        if m["impl"] == "*":  # any DDP: only where the verdict does not depend on it (a backend's)
            if case is not None and REGISTRY[case.kind].needs_impl:
                out.append(f"line {n}: implementation '*' on case {case.name}, whose verdicts depend on the DDP")
        elif m["impl"] not in IMPLS:
            out.append(f"line {n}: no implementation row {m['impl']!r}")
        if m["runtime"] not in RUNTIMES:
            out.append(f"line {n}: no runtime {m['runtime']!r}")
        if int(m["w"]) < 2:
            out.append(f"line {n}: world size {m['w']} < 2")
        num = re.match(r"finding (\d+)\b", comment)
        if not (num and num[1] in numbers) and not any(t in comment for t in titles):
            out.append(f"line {n}: comment {comment!r} names no finding of docs/findings.md "
                       "('finding N: ...' or a bold bullet title)")
    return out


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_expected_failures_name_existing_verdicts_and_findings(path):
    lines = path.read_text().splitlines()
    assert any(ln.split("#", 1)[0].strip() for ln in lines), f"{path.name} lists nothing"
    got = problems(lines, (DOCS / "findings.md").read_text())
    assert not got, "\n".join(got)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_no_duplicate_lines(path):
    ids = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    ids = [i for i in ids if i]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


FINDINGS_MD = "## 3. replicate() never broadcasts buffers\n\n* **Comm hooks under compiled DDP**: ...\n"


@pytest.mark.parametrize("line,needle", [
    ("parity.nosuch:param_parity[replicate-cpu-w2]  # finding 3", "no case 'parity.nosuch'"),
    ("parity.linear:buffer_parity[replicate-cpu-w2]  # finding 3", "reports no check 'buffer_parity'"),
    ("parity.batchnorm:buffer_parity[nosuch-cpu-w2]  # finding 3", "no implementation row 'nosuch'"),
    ("parity.batchnorm:buffer_parity[replicate-tpu-w2]  # finding 3", "no runtime 'tpu'"),
    ("parity.batchnorm:buffer_parity[replicate-cpu-w1]  # finding 3", "world size 1 < 2"),
    ("parity.batchnorm:buffer_parity[replicate]  # finding 3", "is not a verdict id"),
    ("parity.batchnorm:buffer_parity[replicate-cpu-w2]  # finding 9", "names no finding"),
    ("parity.batchnorm:buffer_parity[replicate-cpu-w2]", "names no finding"),
    ("parity.batchnorm:buffer_parity[*-cpu-w2]  # finding 3", "whose verdicts depend on the DDP"),
])
def test_checker_rejects_a_dead_or_unexplained_line(line, needle):
    got = problems([line], FINDINGS_MD)
    assert any(needle in p for p in got), got


@pytest.mark.parametrize("line", [
    "parity.batchnorm:buffer_parity[replicate-cpu-w2]  # finding 3: buffers",
    "feature.comm_hook:param_parity[torch_compiled_autograd-cpu-w2]  # Comm hooks under compiled DDP",
    "collective.all_reduce:result[*-cpu-w2]  # finding 3: a backend's verdict, for every DDP",
    "# a comment line",
    "",
])
def test_checker_accepts_a_live_explained_line(line):
    assert problems([line], FINDINGS_MD) == []


def test_tox_cpu_runs_every_shipped_path():
    """`tox -e cpu` passes every row of conformance.impls.torch_paths to the CLI (a new row is not
    left out of CI), with no expected-failures file: the kit applies its own findings."""
    import configparser

    from conformance.impls.torch_paths import shipped_rows
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(DOCS.parent / "tox.ini")
    run = [ln for ln in tox["testenv:cpu"]["commands"].splitlines() if "-m conformance run" in ln]
    assert len(run) == 1, run
    ddp = re.search(r"--ddp (\S+)", run[0])[1].split(",")
    assert ddp == ["all"] or sorted(ddp) == sorted(r.name for r in shipped_rows())
    assert "expected-failures" not in tox["testenv:cpu"]["commands"]


def test_every_findings_file_is_in_the_table():
    """A file under conformance/report/findings/ that FILES does not name would never apply."""
    assert sorted(p.name for p in FOLDER.glob("*.txt")) == sorted(f.name for f in FILES)


# --- the semantics of an expected-failures file (conformance.report.expected) -------------

def _verdict(case, check, impl, status, w=2, runtime="cpu"):
    from conformance.verdict import Verdict
    return Verdict(case=case, check=check, impl=impl, runtime=runtime, model="linear", world_size=w,
                   status=status, reason="why")


def _run(entries, verdicts):
    from conformance.report.expected import apply_expected_failures, parse_expected_failures
    warnings = apply_expected_failures(verdicts, parse_expected_failures("\n".join(entries)))
    return [v.status for v in verdicts], warnings


@pytest.mark.parametrize("entry", [
    "parity.linear",                                          # a case
    "parity.linear:param_parity",                             # a case:check
    "parity.linear:param_parity[mypkg.ddp:MyDDP-cpu-w2]",     # a verdict id
    "parity.*:param_parity[mypkg*-cpu-w*]",                   # a pattern over ids
    "parity.lin?ar:param_parity[mypkg.ddp:MyDDP-cpu-w?]",
    "*",
])
def test_an_entry_names_a_case_a_check_an_id_or_a_pattern(entry):
    statuses, warnings = _run([entry], [_verdict("parity.linear", "param_parity", "mypkg.ddp:MyDDP", "fail")])
    assert statuses == ["xfail"] and warnings == [], warnings


@pytest.mark.parametrize("entry", [
    "parity.mlp", "parity.linear:loss_parity", "parity.linear:param_parity[torch-cpu-w2]",
    "parity.*:param_parity[mypkg*-cpu-w3]", "parity.linear:param_parity[mypkg.ddp:MyDDP-cpu-w]",
    "parity.lin", "parity.linear:param", "feature.*",
])
def test_an_entry_that_does_not_name_the_verdict_leaves_it_failing(entry):
    statuses, warnings = _run([entry], [_verdict("parity.linear", "param_parity", "mypkg.ddp:MyDDP", "fail")])
    assert statuses == ["fail"]
    assert warnings == [f"expected failure {entry} matches no verdict of this run"]


def test_brackets_are_literal_not_fnmatch_classes():
    """fnmatch would read ``[mutant:x-cpu-w2]`` as a character class."""
    from conformance.report.expected import parse_expected_failures
    exp = parse_expected_failures("parity.linear:param_parity[mutant:x-cpu-w2]")
    assert "parity.linear:param_parity[mutant:x-cpu-w2]" in exp
    assert "parity.linear:param_parityx" not in exp


def test_a_listed_vacuous_verdict_is_xfail_and_says_it_was_vacuous():
    v = _verdict("parity.linear", "agreement", "ref", "vacuous")
    statuses, warnings = _run(["parity.linear:agreement"], [v])
    assert statuses == ["xfail"] and warnings == []
    assert v.reason.startswith("expected failure (vacuous): ")


def test_warnings_per_entry_no_longer_fails_and_matches_nothing():
    vs = [_verdict("parity.linear", "param_parity", "ref", "pass"),
          _verdict("parity.linear", "agreement", "ref", "pass"),
          _verdict("parity.mlp", "param_parity", "ref", "fail"),
          _verdict("parity.mlp", "agreement", "ref", "pass")]
    statuses, warnings = _run(["parity.linear  # all pass", "parity.mlp", "parity.linear:agreement[ref-cpu-w2]",
                               "parity.gone"], vs)
    assert statuses == ["pass", "pass", "xfail", "pass"]
    assert warnings == [  # parity.mlp still fails one verdict: no warning for it
        "expected failure parity.linear no longer fails (its 2 verdicts: 2 pass)",
        "expected failure parity.linear:agreement[ref-cpu-w2] no longer fails (status pass)",
        "expected failure parity.gone matches no verdict of this run"]


def test_a_binary_file_is_one_usage_error(tmp_path):
    from conformance.errors import UsageError
    from conformance.report.expected import read_expected_failures
    for data in (b"\x89PNG\r\n\x1a\n\xff\xfe", b"parity.linear\x00\x00"):
        (tmp_path / "x.bin").write_bytes(data)
        with pytest.raises(UsageError, match="not a text file"):
            read_expected_failures(str(tmp_path / "x.bin"))
    (tmp_path / "ok.txt").write_text("parity.linear  # comment\n\n# only a comment\nparity.mlp:agreement\n")
    assert list(read_expected_failures(str(tmp_path / "ok.txt"))) == ["parity.linear", "parity.mlp:agreement"]


@pytest.mark.parametrize("line,needle", [
    ("hello world", "line 2: 'hello world' is not an entry"),
    ("foo", "a case name is <family>.<name>"),
    ("lorem.ipsum", "a case name is <family>.<name>"),
    ("parity.linear[torch-cpu-w2]", "a verdict id is <case>:<check>[...]"),
    ("parity.linear:param_parity[garbage]", "the bracket holds <impl>-<runtime>-w<W>"),
    ("\u00e9\u00e8 \u2603 ;;", "is not an entry"),
])
def test_a_malformed_line_is_one_usage_error(tmp_path, line, needle):
    """Garbage (random words, text that is no entry) is refused, not warned about (issue 29 item 6)."""
    from conformance.errors import UsageError
    from conformance.report.expected import read_expected_failures
    (tmp_path / "x.txt").write_text(f"parity.linear  # ok\n{line}\n", encoding="utf-8")
    with pytest.raises(UsageError, match=re.escape(needle)) as info:
        read_expected_failures(str(tmp_path / "x.txt"))
    assert "\n" not in str(info.value)


def test_well_formed_entries_that_match_nothing_are_read(tmp_path):
    from conformance.report.expected import read_expected_failures
    entries = ["parity.gone", "feature.nope:nothing", "parity.linear:param_parity[mypkg.ddp:MyDDP-cpu-w2]",
               "parity.*:agreement[mypkg*-cpu-w*]", "*", "*[ref-cpu-w2]", "scenario.core:params[ref-pjrt-w?]",
               "parity.linear:param_parity[my-pkg.ddp:DDP-pjrt_spmd-w4]"]
    (tmp_path / "x.txt").write_text("\n".join(entries) + "\n")
    assert list(read_expected_failures(str(tmp_path / "x.txt"))) == entries
    for path in PATHS:
        assert len(read_expected_failures(str(path))) > 0


# --- the kit's own findings (conformance.report.findings) ---------------------------------

def test_a_shipped_finding_is_xfail_naming_it_and_warns_only_when_it_stops_failing():
    from conformance.report.expected import apply_expected_failures, parse_expected_failures
    kit = parse_expected_failures("collective.noncontiguous.all_reduce:result[*-cpu-w2]  # finding 13: gloo\n"
                                  "parity.gone:param_parity[torch-cpu-w2]  # finding 12: torch", shipped=True)
    failing = _verdict("collective.noncontiguous.all_reduce", "result", "gloo", "fail")
    assert apply_expected_failures([failing], kit) == []  # the unmatched shipped entry is no news
    assert failing.status == "xfail" and failing.reason.startswith("expected failure (finding 13: gloo): ")
    passing = _verdict("collective.noncontiguous.all_reduce", "result", "gloo", "pass")
    assert apply_expected_failures([passing], kit) == [
        "the kit's finding collective.noncontiguous.all_reduce:result[*-cpu-w2] (finding 13: gloo) "
        "no longer fails (status pass)"]


def test_a_users_entry_that_repeats_a_shipped_one_is_warned_about_as_the_users():
    from conformance.report.expected import expected_failure_warnings, parse_expected_failures
    both = parse_expected_failures("parity.gone") + parse_expected_failures("parity.gone  # f", shipped=True)
    assert expected_failure_warnings([], both) == ["expected failure parity.gone matches no verdict of this run"]


def test_findings_apply_on_their_release_only(monkeypatch):
    from conformance.report import findings
    monkeypatch.setattr(findings.metadata, "version", lambda pkg: {"torch": "2.13.0"}.get(pkg) or
                        (_ for _ in ()).throw(findings.metadata.PackageNotFoundError(pkg)))
    kit = findings.kit_findings()
    assert kit.applied == ("cpu-torch-2.13.txt", "cpu-torch-2.13-shipped-paths.txt")
    assert kit.not_applied[0] == ("pjrt-torch_xla-2.9.txt", "measured on torch_xla 2.9, installed none")
    assert {f for f, why in kit.not_applied[1:] if why.endswith("installed none")} == {  # the engines' extras
        f.name for f in findings.FILES if f.package not in ("torch", "torch_xla")}
    assert "collective.noncontiguous.all_reduce:result[gloo-cpu-w2]" in kit.expected
    monkeypatch.setattr(findings.metadata, "version", lambda pkg: "2.130.0")  # not the 2.13 line
    assert findings.kit_findings().applied == ()
    strict = findings.kit_findings(strict=True)
    assert strict.applied == () and len(strict.expected) == 0
