"""``python -m conformance report``: a self-contained HTML report of run and calibration JSON."""
from __future__ import annotations

from conformance.report.html import _load, write_report
from conformance.errors import UsageError


def command(settings, *, json: list[str], calibration: list[str], out: str) -> int:
    """Write the HTML report of run (and calibration) JSON files into ``out``."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("report needs matplotlib: pip install -e '.[report]' (from a clone)") from None
    runs = [_load(p) for p in json]
    for p, d in zip(json, runs):
        if "verdicts" not in d:
            raise UsageError(f"{p}: no 'verdicts' key: not a run JSON "
                             "(python -m conformance run --json, or pytest --conformance-json)")
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
    return p
