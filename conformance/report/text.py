"""One verdict-table renderer, one kill-matrix table and one JSON builder for every face
(CLI, pytest plugin, absltest, HTML report); the kill matrix's rows are
:mod:`conformance.report.kills`."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import sys
import tempfile
import time

from conformance.report.kills import SURVIVED, KillRow, kill_summary
from conformance.verdict import BAD, STATUSES, Verdict
from conformance.tolerances import TOLERANCES

#: Version of the JSON report layout (docs/report-format.md).
SCHEMA_VERSION = 2
#: Characters of a reason a text table prints (the JSON and the failures file keep all of it).
REASON_WIDTH = 120


def fmt(x, spec=".2e") -> str:
    return "-" if x is None or x != x else ("inf" if x == float("inf") else format(x, spec))


#: The bound column: the bound the verdict used at its worst element (``Verdict.atol``).
BOUND_HEADER = "bound (atol+rtol|ref|)"


def verdict_cells(v: Verdict) -> dict:
    """The cells of one verdict row, as every table (text and HTML) shows them."""
    return {"case": v.case, "check": v.check, "model": v.model, "impl": v.impl, "runtime": v.runtime,
            "W": str(v.world_size), "status": v.status, "max dev": fmt(v.max_dev), BOUND_HEADER: fmt(v.atol),
            "margin": fmt(v.margin, ".3g"), "first bad step": "-" if v.first_bad_step is None else str(v.first_bad_step),
            "replica": "-" if v.replica is None else str(v.replica), "reason": v.reason}


def first_sentence(text: str, width: int = REASON_WIDTH) -> str:
    """``text`` on one line if it fits in ``width`` characters, else its first
    sentence, cut at a word boundary if still too long (never mid-word: a single
    longer word is kept whole); `` ...`` marks what was left out."""
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    # a sentence ends at ". " (not in "1.5e-05" or "fc.weight")
    m = re.search(r"[.!?](?=\s)", text)
    head = text[:m.end()] if m else text
    if len(head) > width:
        cut = head.rfind(" ", 0, width + 1)
        head = head[:cut] if cut > 0 else head.split(" ", 1)[0]
        head = head.rstrip(" ,;:(")
    return head + " ..."


def text_table(rows: list[dict]) -> str:
    """Rows as aligned columns; the last column (a reason) shortened by :func:`first_sentence`."""
    if not rows:
        return "(no rows)"
    head = list(rows[0])
    lines = [head] + [[str(r[h]) for h in head] for r in rows]
    lines = [ln[:-1] + [first_sentence(ln[-1])] for ln in lines]
    widths = [max(len(ln[i]) for ln in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(ln, widths)) + "  " + ln[-1] for ln in lines)


def verdict_table(verdicts: list[Verdict]) -> str:
    """One line per verdict: case, check, model, impl, runtime, W, status, max dev, bound, margin,
    first bad step, deviating replica, reason."""
    return text_table([verdict_cells(v) for v in verdicts])


def counts(verdicts: list[Verdict]) -> dict:
    return {s: sum(v.status == s for v in verdicts) for s in STATUSES}


def kill_matrix_text(rows: list[KillRow]) -> str:
    """Every mutant x every case that must kill it, on each runtime and world size."""
    summ = kill_summary(rows)
    table = [{"mutant": r.mutant, "runtime": f"{r.runtime}-w{r.world_size}", "case": r.case,
              "result": r.result, "mutant verdict": summ[(r.mutant, r.runtime, r.world_size)],
              "reason": r.reason()} for r in rows]
    return text_table(table)


def environment() -> dict:
    env = {"python": sys.version.split()[0], "platform": platform.platform()}
    try:
        import torch
        env["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version
        env["torch_xla"] = version("torch_xla")
    except Exception:
        env["torch_xla"] = None
    return env


def document(kind: str, **body) -> dict:
    """The header every JSON document of the kit starts with - ``kit``, ``kind`` (``run``,
    ``repeat``, ``calibration``, ``ranks``), ``schema``, ``created`` (UTC, ISO 8601),
    ``environment`` - followed by ``body``."""
    return {"kit": "ddp-conformance", "kind": kind, "schema": SCHEMA_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "environment": environment(),
            **body}


def build_json(verdicts: list[Verdict], kill_rows: list[KillRow] = (), extra: dict | None = None) -> dict:
    """The run report (layout: docs/report-format.md)."""
    doc = document("run", tolerances=[t.__dict__ for t in TOLERANCES], counts=counts(verdicts),
                   verdicts=[v.to_json() for v in verdicts], kill_matrix=[r.to_json() for r in kill_rows],
                   kill_summary=[{"mutant": m, "runtime": rt, "world_size": w, "result": res}
                                 for (m, rt, w), res in kill_summary(list(kill_rows)).items()])
    doc.update(extra or {})
    return doc


def write_json(path, verdicts: list[Verdict], kill_rows: list[KillRow] = (), extra: dict | None = None) -> dict:
    """Write :func:`build_json`'s report to ``path`` and return it. ``path`` is a file name
    (written whole or not at all: a temporary file in the same folder, then renamed, so a
    reader never sees half a report) or an open text stream (``--json -``: stdout)."""
    doc = build_json(verdicts, kill_rows, extra)
    write_json_doc(path, doc)
    return doc


def write_json_doc(path, doc: dict) -> None:
    """``doc`` as indented JSON to a file name (atomically: :func:`replaced`) or an open text stream."""
    if hasattr(path, "write"):
        json.dump(doc, path, indent=1)
        path.write("\n")
        path.flush()
        return
    with replaced(path) as f:
        f.write(json.dumps(doc, indent=1).encode())


@contextlib.contextmanager
def replaced(path: str):
    """A temporary file beside ``path``, open for binary writing, that replaces ``path`` when the
    block ends (a reader never sees half a file) and is removed if it raises."""
    target = os.path.realpath(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                               dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def exit_code(verdicts: list[Verdict], kill_rows: list[KillRow] = (), judge_backend: bool = True) -> int:
    """0 unless a verdict is fail/vacuous or a mutant survived a case that must kill it.
    ``judge_backend=False``: the backend's verdicts (``Verdict.subject``) do not count (a run
    certifying a DDP reports them apart: :func:`backend_section`)."""
    bad = any(v.status in BAD for v in verdicts if judge_backend or v.subject != "backend")
    survived = any(r == SURVIVED for r in kill_summary(list(kill_rows)).values())
    return 1 if bad or survived else 0


def backend_section(verdicts: list[Verdict], judged: bool) -> str:
    """The backend's verdicts apart from the DDP's: a heading per backend with its counts,
    then the table of those that did not pass; ``judged``: whether they count toward the exit
    code (``--fail-on-backend``, or a ``--backend`` under test). ``""`` without any."""
    mine = [v for v in verdicts if v.subject == "backend"]
    if not mine:
        return ""
    out = []
    for name in dict.fromkeys(v.impl for v in mine):
        vs = [v for v in mine if v.impl == name]
        c = counts(vs)
        where = ", ".join(f"{rt} W={'/'.join(str(w) for w in sorted({v.world_size for v in vs if v.runtime == rt}))}"
                          for rt in dict.fromkeys(v.runtime for v in vs))
        out.append(f"\nbackend {name} ({where}), judged once beneath every DDP: "
                   + ", ".join(f"{n} {st}" for st, n in c.items() if n)
                   + ("" if judged else "; does not decide the exit code (--fail-on-backend makes it)"))
        shown = [v for v in vs if v.status in BAD + ("xfail",)]
        if shown:
            out.append(verdict_table(shown))
    return "\n".join(out)
