"""docs/findings/expected-failures.txt (the known failures of the target rows that
`tox -e cpu` passes to ``python -m conformance run --expected-failures``) cannot rot
silently: every line names a verdict id that exists - a case of the table, a check
that case reports, an implementation row, a runtime, a world size >= 2 - and a
finding of docs/findings.md in its comment.

The CLI itself only warns about listed ids that no longer fail or match no verdict of
the run (conformance.report.text.apply_expected_failures), so a renamed case or check would
otherwise leave a dead line behind.
"""
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
EXPECTED = DOCS / "findings" / "expected-failures.txt"
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
        if m["impl"] not in IMPLS:
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


def test_expected_failures_name_existing_verdicts_and_findings():
    lines = EXPECTED.read_text().splitlines()
    assert any(ln.split("#", 1)[0].strip() for ln in lines), f"{EXPECTED.name} lists nothing"
    got = problems(lines, (DOCS / "findings.md").read_text())
    assert not got, "\n".join(got)


def test_no_duplicate_lines():
    ids = [ln.split("#", 1)[0].strip() for ln in EXPECTED.read_text().splitlines()]
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
])
def test_checker_rejects_a_dead_or_unexplained_line(line, needle):
    got = problems([line], FINDINGS_MD)
    assert any(needle in p for p in got), got


@pytest.mark.parametrize("line", [
    "parity.batchnorm:buffer_parity[replicate-cpu-w2]  # finding 3: buffers",
    "feature.comm_hook:param_parity[torch_compiled_autograd-cpu-w2]  # Comm hooks under compiled DDP",
    "# a comment line",
    "",
])
def test_checker_accepts_a_live_explained_line(line):
    assert problems([line], FINDINGS_MD) == []


def test_tox_cpu_runs_every_target_row_with_this_file():
    """`tox -e cpu` passes every row of conformance.impls.torch_paths (a new row is not left out of CI)
    and this file to the CLI."""
    import configparser

    from conformance.impls.torch_paths import shipped_rows
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(DOCS.parent / "tox.ini")
    run = [ln for ln in tox["testenv:cpu"]["commands"].splitlines() if "-m conformance run" in ln]
    assert len(run) == 1, run
    ddp = re.search(r"--ddp (\S+)", run[0])[1].split(",")
    assert sorted(ddp) == sorted(r.name for r in shipped_rows())
    assert f"--expected-failures {EXPECTED.relative_to(DOCS.parent)}" in run[0]
