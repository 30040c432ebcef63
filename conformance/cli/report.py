"""``python -m conformance report``: a self-contained HTML report of run and calibration JSON, or
the runs merged into one JSON, failures text or JUnit XML: every format a writer of
:data:`conformance.report.writers.WRITERS` that declares itself a report-time format."""
from __future__ import annotations

import os

from conformance.errors import UsageError
from conformance.report.kills import KillRow
from conformance.report.runs import load_documents, merge_runs
from conformance.report.writers import (DEFAULT_REPORT_FORMAT, WRITERS, RunOutput, report_formats,
                                        report_formats_help, write_all)
from conformance.verdict import Verdict


def command(settings, *, json: list[str], calibration: list[str], out: str, format: str = "html") -> int:
    """Write the report of run (and calibration) JSON files into the folder ``out`` with the
    report-time writer ``format`` of :data:`conformance.report.writers.WRITERS` (module
    docstring); each names the file it writes in ``out``.

    Raises:
        UsageError: a file that is no run / calibration JSON, calibration JSON for a format that
            shows none, or what the writer lacks (matplotlib for HTML).
    """
    writer = WRITERS[format]
    runs = load_documents(json, "verdicts", "run JSON (python -m conformance run --json, or pytest "
                          "--conformance-json)")
    if calibration and not writer.calibration:
        raise UsageError("--calibration goes into the HTML report; drop it or use --format html")
    writer.check()
    cals = load_documents(calibration or [], "calibrations", "calibration JSON (python -m conformance "
                          "calibrate --json)")
    merged = merge_runs(runs)
    result = RunOutput([Verdict.from_json(v) for v in merged["verdicts"]],
                       [KillRow.from_json(k) for k in merged["kill_matrix"]], {"sources": list(json)},
                       runs=runs, calibrations=cals, sources=list(json) + list(calibration or []))
    target = writer.report_target(out)
    os.makedirs(out, exist_ok=True)
    for line in write_all(result, {format: target}) or [f"{format}: {target}"]:
        print(line)
    return 0


def add_parser(sub):
    p = sub.add_parser("report", help="write a self-contained HTML report (tables + sensitivity plot)")
    p.add_argument("--json", action="append", required=True, metavar="RUN.json",
                   help="run JSON (python -m conformance run --mutants --json, or pytest "
                   "--conformance-json); repeat to merge runs (e.g. one per runtime)")
    p.add_argument("--calibration", nargs="+", default=[], metavar="CAL.json",
                   help="calibration JSON file(s) from python -m conformance calibrate --json")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--format", choices=report_formats(), default=DEFAULT_REPORT_FORMAT, help=report_formats_help())
    return p
