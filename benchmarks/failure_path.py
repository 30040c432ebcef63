#!/usr/bin/env python
"""What a broken DDP costs against a correct one: the main command over ``--ddp torch`` and over
torch's DDP whose replica 1 raises in every forward (``tests/outside/raising_torch.py``: it accepts
every keyword, so every case that trains runs and fails), back to back in interleaved rounds::

    python -m conformance run --runtime cpu --ddp IMPL --quiet --json J --junitxml X

Per run: wall seconds, exit code, verdict counts, case seconds per family, the fixed cost and the
machine's core-seconds (:func:`benchmarks.default_run.one_run`); then per round the ratio of the
failing run's wall time to the passing run's, and their medians. The target is a ratio of 1.5 or
less. A script, not a test::

    python benchmarks/failure_path.py --times 3

Exit 0 when every run completed (the failing run exits 1 by design), 1 when one did not, 2 on bad
input (one ``error:`` line).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.default_run import ROOT, one_run  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "failure-path.json")
PASSING = "torch"
FAILING = "tests.outside.raising_torch:RaisingTorchDDP"
TARGET_RATIO = 1.5


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--times", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--lanes", type=int, default=2, help="lanes of each run (default 2, the CLI's)")
    p.add_argument("--timeout", type=float, default=1800, help="bound on each run, s")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON output (default benchmarks/results/failure-path.json)")
    args = p.parse_args(argv)
    if args.times < 1 or not 1 <= args.lanes <= 8:
        print("error: --times >= 1 and --lanes from 1 to 8", file=sys.stderr)
        return 2
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
           "passing": PASSING, "failing": FAILING, "target_ratio": TARGET_RATIO, "runs": [], "rounds": []}
    ok = True

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.times):
            walls = {}
            for impl in (PASSING, FAILING) if i % 2 == 0 else (FAILING, PASSING):
                row, digest = one_run(sys.executable, "cpu", impl, "forkserver", args.lanes, args.timeout, tmp)
                row["round"] = i
                ok = ok and digest is not None
                walls[impl] = row.get("wall_s")
                doc["runs"].append(row)
                save()
                print(json.dumps({k: row.get(k) for k in ("round", "impl", "wall_s", "exit", "counts",
                                                           "load_before")}), flush=True)
            if None not in walls.values():
                doc["rounds"].append({"round": i, "passing_s": walls[PASSING], "failing_s": walls[FAILING],
                                      "ratio": round(walls[FAILING] / walls[PASSING], 3)})
        if doc["rounds"]:
            ratios = [r["ratio"] for r in doc["rounds"]]
            doc["median_ratio"] = statistics.median(ratios)
            doc["median_passing_s"] = statistics.median(r["passing_s"] for r in doc["rounds"])
            doc["median_failing_s"] = statistics.median(r["failing_s"] for r in doc["rounds"])
            doc["within_target"] = doc["median_ratio"] <= TARGET_RATIO
            print(json.dumps({k: doc[k] for k in ("median_passing_s", "median_failing_s", "median_ratio",
                                                  "within_target")}), flush=True)
        save()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
