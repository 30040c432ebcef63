#!/usr/bin/env python
"""The main command beside busy loops: does a correct DDP still pass on a loaded machine?

Starts ``--busy`` processes that spin on a core each (``while True: pass``), then runs
``python -m conformance run --runtime RT --ddp DDP --quiet --json <tmp>`` ``--times`` times
for every ``--ddp`` entry, one after the other, and writes JSON (``--out``): per run the
command, exit code, wall seconds, the verdict counts of its report, the failing verdicts
(first 5) and the 1-minute load average before and after. The busy loops are killed when the
script ends, also on Ctrl-C or an error. A measurement, not a test: it exits 0 when every run
finished (whatever its verdicts), 1 when a run timed out, 2 on bad input (one ``error:``
line).

    python benchmarks/load_runs.py --runtime cpu --ddp torch,ref --busy 4 --times 3
    PJRT_ENV/bin/python benchmarks/load_runs.py --runtime pjrt \\
        --ddp ref,tests.outside.xla_graphs:XlaMaskBroadcastDDP --busy 4 --times 3
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "load-runs.json")
BUSY_LOOP = "while True: pass"


def start_busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning on a core each (their own process group: killed as one)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True) for _ in range(n)]


def stop_busy(procs) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def one_run(runtime: str, ddp: str, timeout_s: float, extra: list[str]) -> dict:
    """One main command; its verdict counts and failing verdicts from the JSON report."""
    with tempfile.TemporaryDirectory(prefix="load-run-") as tmp:
        report = os.path.join(tmp, "run.json")
        cmd = [sys.executable, "-m", "conformance", "run", "--runtime", runtime, "--ddp", ddp, "--quiet",
               "--json", report] + extra
        load0, t0 = os.getloadavg()[0], time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            rc = None
        wall = round(time.monotonic() - t0, 1)
        try:
            with open(report) as f:
                verdicts = json.load(f).get("verdicts", [])
        except (OSError, ValueError):
            verdicts = []
    bad = [v for v in verdicts if v.get("status") in ("fail", "vacuous")]
    return {"ddp": ddp, "runtime": runtime, "exit_code": rc, "timed_out": rc is None, "wall_s": wall,
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
            "counts": dict(Counter(v.get("status") for v in verdicts)),
            "failing": [f"{v.get('id')} {v.get('status')} {str(v.get('reason', ''))[:200]}" for v in bad[:5]],
            "stderr_tail": err.strip().splitlines()[-3:] if rc not in (0, 1) else [],
            "command": " ".join(["python", "-m", "conformance", "run", "--runtime", runtime, "--ddp", ddp,
                                 "--quiet", "--json", "<tmp>/run.json"] + extra)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--ddp", default="torch,ref", help="comma list: each is run --times times on its own")
    ap.add_argument("--busy", type=int, default=4, help="busy-loop processes beside the runs (default 4)")
    ap.add_argument("--times", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--extra", default="", help="more arguments of the main command (one string)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.busy < 0 or args.times < 1 or args.timeout <= 0:
        print("error: --busy >= 0, --times >= 1 and --timeout > 0", file=sys.stderr)
        return 2
    extra = args.extra.split() if args.extra else []
    try:  # keep the other runtime's section
        with open(args.out) as f:
            old = json.load(f)
        doc = {"results": [r for r in old.get("results", []) if r.get("runtime") != args.runtime]}
    except (OSError, ValueError):
        doc = {"results": []}
    section = {"runtime": args.runtime, "busy_loops": args.busy, "cpus": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d"), "runs": []}
    doc["results"].append(section)
    busy = start_busy(args.busy)
    try:
        for k in range(args.times):
            for ddp in args.ddp.split(","):
                r = one_run(args.runtime, ddp, args.timeout, extra)
                section["runs"].append(r)
                print(f"{ddp} run {k + 1}: exit {r['exit_code']} in {r['wall_s']} s, load "
                      f"{r['load_before']} -> {r['load_after']}, {r['counts']}", flush=True)
                os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                with open(args.out, "w") as f:
                    json.dump(doc, f, indent=1)
    finally:
        stop_busy(busy)
    return 1 if any(r["timed_out"] for r in section["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
