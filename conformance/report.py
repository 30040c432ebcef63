"""Text tables and the JSON report of a conformance run."""
from __future__ import annotations

import json
import platform
import sys
import time

from .checks import Verdict


def _fmt(x, spec=".2e"):
    return "-" if x is None or x != x else ("inf" if x == float("inf") else format(x, spec))


def verdict_table(verdicts: list[Verdict]) -> str:
    """One line per verdict: check, model, impl, runtime, W, status, max dev, atol, margin."""
    head = ("check", "model", "impl", "runtime", "W", "status", "max_dev", "atol", "margin", "reason")
    rows = [head] + [(v.check, v.model, v.impl, v.runtime, str(v.world_size), v.status,
                      _fmt(v.max_dev), _fmt(v.atol), _fmt(v.margin, ".3g"), v.reason[:70])
                     for v in verdicts]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def kill_cells(verdicts: list[Verdict], checks: list[str]) -> dict[str, str]:
    """Per check: ``KILL`` if it failed on some model, ``vac`` if only vacuous, ``-`` if it passed,
    ``n/a`` if it did not run (no verdict, or only unsupported/skip ones)."""
    cells = {}
    for c in checks:  # a feature's "<feature>.<check>" counts under <check>
        st = {v.status for v in verdicts if v.check.split(".")[-1] == c} - {"unsupported", "skip"}
        cells[c] = "KILL" if "fail" in st else "vac" if "vacuous" in st else "-" if st else "n/a"
    return cells


def kill_matrix_text(rows: list[tuple], checks: list[str]) -> str:
    """Rows ``(runtime, world_size, mutant, verdicts)`` as a mutant x check matrix."""
    head = ["mutant", "runtime"] + checks + ["killed"]
    lines = [head]
    for runtime, w, mutant, verdicts in rows:
        cells = kill_cells(verdicts, checks)
        ran = any(v.status not in ("unsupported", "skip") for v in verdicts)
        lines.append([mutant, f"{runtime}-w{w}"] + [cells[c] for c in checks]
                     + ["yes" if "KILL" in cells.values() else "NO" if ran else "unsupported"])
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in lines)


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


def verdict_from_json(d: dict) -> Verdict:
    """Inverse of :meth:`Verdict.to_json` (``None`` numbers come back as NaN)."""
    nums = ("max_dev", "atol", "margin", "movement")
    return Verdict(**{k: (float("nan") if k in nums and v is None else v) for k, v in d.items()})


def write_json(path: str, verdicts: list[Verdict], kill_rows: list[tuple] = (), extra: dict | None = None) -> dict:
    """Write the report; return the dict written."""
    from .checks import CHECKS
    from .tolerances import TOLERANCES
    doc = {"kit": "ddp-conformance", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "environment": environment(),
           "tolerances": [t.__dict__ for t in TOLERANCES],
           "verdicts": [v.to_json() for v in verdicts],
           "kill_matrix": [{"runtime": r, "world_size": w, "mutant": m,
                            "cells": kill_cells(vs, list(CHECKS)),
                            "verdicts": [v.to_json() for v in vs]} for r, w, m, vs in kill_rows]}
    doc.update(extra or {})
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return doc
