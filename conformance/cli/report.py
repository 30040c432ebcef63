"""``python -m conformance report``: a self-contained HTML report of run and calibration JSON, or
the runs merged into one JSON, failures text or JUnit XML."""
from __future__ import annotations

import os

from conformance.errors import UsageError
from conformance.report.html import _load, merge_runs, write_report
from conformance.report.text import KillRow
from conformance.verdict import Verdict


#: ``--format`` -> the file it writes into ``--out`` (html: the page and its figures).
FORMAT_FILES = {"json": "report.json", "failures": "report.json", "junit": "junit.xml"}


def command(settings, *, json: list[str], calibration: list[str], out: str, format: str = "html") -> int:
    """Write the report of run (and calibration) JSON files into the folder ``out``: HTML
    (default; needs matplotlib), or with ``format`` ``json`` (the runs merged into one run
    report), ``failures`` (the failures text) or ``junit`` (JUnit XML), through the same
    writers as ``run`` (:mod:`conformance.report.writers`).

    Raises:
        UsageError: a file that is no run / calibration JSON, or matplotlib missing for HTML.
    """
    runs = [_load(p) for p in json]
    for p, d in zip(json, runs):
        if "verdicts" not in d:
            raise UsageError(f"{p}: no 'verdicts' key: not a run JSON "
                             "(python -m conformance run --json, or pytest --conformance-json)")
    if format != "html":
        if calibration:
            raise UsageError("--calibration goes into the HTML report; drop it or use --format html")
        from conformance.report.writers import RunOutput, write_all  # the case table: heavy imports
        merged = merge_runs(runs)
        result = RunOutput([Verdict.from_json(v) for v in merged["verdicts"]],
                           [KillRow.from_json(k) for k in merged["kill_matrix"]], {"sources": list(json)})
        os.makedirs(out, exist_ok=True)
        lines = write_all(result, {format: os.path.join(out, FORMAT_FILES[format])})
        for line in lines or [f"{format}: {os.path.join(out, FORMAT_FILES[format])}"]:
            print(line)
        return 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("report needs matplotlib: pip install -e '.[report]' (from a clone)") from None
    cals = [_load(p) for p in calibration or []]
    for p, d in zip(calibration or [], cals):
        if "calibrations" not in d:
            raise UsageError(f"{p}: no 'calibrations' key: not a calibration JSON "
                             "(python -m conformance calibrate --json)")
    paths = write_report(runs, cals, out, sources=list(json) + list(calibration or []))
    for k, p in paths.items():
        print(f"{k}: {p}")
    return 0


def add_parser(sub):
    """Register the ``report`` subcommand on ``sub`` (argparse subparsers)."""
    p = sub.add_parser("report", help="write a self-contained HTML report (tables + sensitivity plot)")
    p.add_argument("--json", action="append", required=True, metavar="RUN.json",
                   help="run JSON (python -m conformance run --mutants --json, or pytest "
                   "--conformance-json); repeat to merge runs (e.g. one per runtime)")
    p.add_argument("--calibration", nargs="+", default=[], metavar="CAL.json",
                   help="calibration JSON file(s) from python -m conformance calibrate --json")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--format", choices=("html", "json", "failures", "junit"), default="html",
                   help="html (default: tables, coverage, sensitivity plot), json (the runs merged), "
                   "failures (text) or junit (XML), written by the same writers as run")
    return p
