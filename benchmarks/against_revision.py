#!/usr/bin/env python
"""The default CPU run of one DDP with this checkout's kit against the kit of an earlier revision,
back to back in interleaved rounds (the other revision is checked out with ``git worktree`` into a
temporary directory and removed after)::

    python benchmarks/against_revision.py --rev HEAD~1 [--ddp torch] [--times 3]

Per run: wall seconds, exit code, verdict counts (:func:`benchmarks.default_run.one_run`); per
round the ratio of this checkout's wall time to the revision's; their medians. A script, not a
test. Exit 0 when every run completed, 1 when one did not, 2 on bad input (one ``error:`` line).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.default_run import ROOT, one_run  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rev", required=True, help="the revision to compare with (git rev-parse syntax)")
    p.add_argument("--ddp", default="torch", help="the DDP under test (default torch)")
    p.add_argument("--times", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--timeout", type=float, default=1800, help="bound on each run, s")
    p.add_argument("--out", default=None, help="JSON output (default benchmarks/results/against-<rev>.json)")
    args = p.parse_args(argv)
    if args.times < 1:
        print("error: --times must be >= 1", file=sys.stderr)
        return 2
    got = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, capture_output=True, text=True)
    if got.returncode:
        print(f"error: --rev {args.rev!r}: not a revision of this checkout", file=sys.stderr)
        return 2
    rev = got.stdout.strip()
    out = args.out or os.path.join(ROOT, "benchmarks", "results", f"against-{rev}.json")
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "ddp": args.ddp,
           "revision": rev, "runs": [], "rounds": []}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", base, rev], cwd=ROOT, check=True)
        try:
            for i in range(args.times):
                walls = {}
                order = (("this", ROOT), ("revision", base))
                for who, root in order if i % 2 == 0 else order[::-1]:
                    row, digest = one_run(sys.executable, "cpu", args.ddp, "forkserver", 2, args.timeout, tmp,
                                          root=root)
                    row.update(round=i, kit=who)
                    ok = ok and digest is not None
                    walls[who] = row.get("wall_s")
                    doc["runs"].append(row)
                    print(json.dumps({k: row.get(k) for k in ("round", "kit", "wall_s", "exit", "counts")}), flush=True)
                if None not in walls.values():
                    doc["rounds"].append({"round": i, **{f"{k}_s": v for k, v in walls.items()},
                                          "ratio": round(walls["this"] / walls["revision"], 3)})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", base], cwd=ROOT)
    if doc["rounds"]:
        doc["median_ratio"] = statistics.median(r["ratio"] for r in doc["rounds"])
        print(json.dumps({"median_ratio": doc["median_ratio"]}), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
