#!/usr/bin/env python
"""The correct DDPs over every zoo model (docs/zoo.md, "Held to account")::

    python benchmarks/zoo_verdicts.py --ddp torch,ref --out benchmarks/results/zoo-verdicts.json

Runs ``python -m conformance run --ddp DDP --model zoo:NAME`` per zoo model (``--models``: a comma
list; default all) and writes per model: the exit code, wall seconds, verdict counts and every
verdict that is not ``pass`` with its reason. A script, not a test. Exit 0 when every run exited
0, 1 otherwise, 2 on bad input (one ``error:`` line).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from fixtures.zoo import PREFIX, zoo  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ddp", default="torch,ref")
    p.add_argument("--models", default="", help="comma list of zoo names (default: every one)")
    p.add_argument("--world-size", default="", help="comma list (default: the run's own, 2,3 on CPU)")
    p.add_argument("--timeout", type=float, default=1800, help="bound on each run, s")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "zoo-verdicts.json"))
    args = p.parse_args(argv)
    names = [n for n in args.models.split(",") if n] or list(zoo())
    unknown = [n for n in names if n not in zoo()]
    if unknown:
        print(f"error: --models: no zoo model {unknown[0]!r}; known: {', '.join(zoo())}", file=sys.stderr)
        return 2
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "ddp": args.ddp,
           "world_size": args.world_size or "default", "models": {}}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = os.path.join(tmp, f"{name}.json")
            start = time.monotonic()
            got = subprocess.run([sys.executable, "-m", "conformance", "run", "--ddp", args.ddp, "--model",
                                  PREFIX + name, "--quiet", "--json", out,
                                  *(["--world-size", args.world_size] if args.world_size else [])], cwd=tmp, capture_output=True, text=True,
                                 timeout=args.timeout)
            row = {"exit": got.returncode, "wall_s": round(time.monotonic() - start, 1)}
            if os.path.exists(out):
                with open(out) as f:
                    vs = json.load(f)["verdicts"]
                row["counts"] = dict(collections.Counter(v["status"] for v in vs))
                row["not_pass"] = [{k: v[k] for k in ("case", "check", "impl", "world_size", "status", "reason")}
                                   for v in vs if v["status"] != "pass"]
            else:
                row["stderr"] = got.stderr[-2000:]
            ok = ok and got.returncode == 0
            doc["models"][name] = row
            print(f"{name}: exit {got.returncode}, {row['wall_s']} s, {row.get('counts')}", flush=True)
            _write(args.out, doc)  # after each model: a long sweep keeps what it measured
    return 0 if ok else 1


def _write(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
