#!/usr/bin/env python
"""What ``scenario.zoo`` adds to the default run of one DDP, in CPU seconds of the whole process
tree (the run, its fork server and replica hosts), which a loaded machine inflates far less than
wall time::

    python benchmarks/zoo_cost.py --ddp ref --out benchmarks/results/zoo-cost.json

Runs ``python -m conformance run --ddp DDP`` (the default run) and ``... --only scenario.zoo``
once each, concurrently, sampling ``/proc/<pid>/stat`` (utime + stime) of every descendant every
0.2 s; writes both totals, their walls and the share ``zoo / (default - zoo)`` (what the case adds
to the run without it). A script, not a test. Exit 0 when both runs exited 0, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict:
    kids: dict = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kids.setdefault(int(fields[1]), []).append((int(pid), (int(fields[11]) + int(fields[12])) / TICK))
    return kids


def _tree_cpu(root: int, seen: dict) -> None:
    """Record into ``seen`` the CPU seconds of ``root`` and its descendants (max over samples)."""
    kids, todo = _children(), [root]
    mine = {pid: cpu for procs in kids.values() for pid, cpu in procs}
    seen[root] = max(seen.get(root, 0.0), mine.get(root, 0.0))
    while todo:
        for pid, cpu in kids.get(todo.pop(), ()):
            seen[pid] = max(seen.get(pid, 0.0), cpu)
            todo.append(pid)


def _run(args, tmp, name, extra, out):
    cmd = [sys.executable, "-m", "conformance", "run", "--ddp", args.ddp, "--quiet", "--json",
           os.path.join(tmp, f"{name}.json"), *extra]
    seen: dict = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    while proc.poll() is None:
        _tree_cpu(proc.pid, seen)
        time.sleep(0.2)
    out[name] = {"exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
                 "cpu_s": round(sum(seen.values()), 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ddp", default="ref")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "zoo-cost.json"))
    args = p.parse_args(argv)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [threading.Thread(target=_run, args=(args, tmp, n, extra, out))
                for n, extra in (("default", []), ("zoo", ["--only", "scenario.zoo"]))]
        for t in runs:
            t.start()
        for t in runs:
            t.join()
    zoo, default = out["zoo"]["cpu_s"], out["default"]["cpu_s"]
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
           "load": os.getloadavg()[0], "ddp": args.ddp, **out,
           "zoo_share_of_the_rest": round(zoo / max(default - zoo, 1e-9), 3)}
    print(json.dumps(doc))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0 if all(r["exit"] == 0 for r in out.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
