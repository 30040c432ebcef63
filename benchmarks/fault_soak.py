"""Fault soak: N fault runs in a row; time to report, misattributions, leftover processes.

    python benchmarks/fault_soak.py --runtime cpu --runs 50 --out benchmarks/results/faults-cpu.json

Each run starts a fresh world of 2 replicas (task bound ``--timeout``), injects one
fault on replica 1 at step 1 with :func:`tests.tasks.fault` (kinds cycle
through ``--kinds``; ``sigkill`` kills replica 1's host from outside after
``--kill-after`` s), and records: the error class, the replicas named
(``culprit``), seconds from ``World.run`` to the exception, and host processes
still alive 10 s after ``close()``. A run is *misattributed* when the class is
not the expected one or the named replicas are not ``[1]`` (``skip_collective``:
replica 1 must be among them). Writes JSON; prints one line per kind.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.tasks import fault  # noqa: E402
from conformance.worlds.failure import ReplicaDied, ReplicaError, ReplicaFailed, ReplicaTimeout  # noqa: E402
from conformance.worlds.spawned import World  # noqa: E402

K = 1
EXPECTED = {"raise": (ReplicaFailed,), "exit": (ReplicaDied,), "sleep": (ReplicaTimeout,),
            "skip_collective": (ReplicaDied, ReplicaTimeout), "sigkill": (ReplicaDied,)}


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def one(runtime, kind, timeout, kill_after):
    world = World(runtime, 2, timeout=timeout)
    pids = world.pids()
    killer = None
    if kind == "sigkill":
        killer = threading.Timer(kill_after, os.kill, args=(pids[min(K, len(pids) - 1)], signal.SIGKILL))
        killer.start()
    how = "sleep" if kind == "sigkill" else kind
    t0 = time.monotonic()
    err = None
    try:
        world.run(fault, rank=K, how=how, seconds=timeout * 3)
    except ReplicaError as exc:
        err = exc
    elapsed = time.monotonic() - t0
    if killer:
        killer.cancel()
    world.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if alive(p)]
    named = [d["rank"] for d in err.diagnosis if d.get("culprit")] if err else []
    ok_class = err is not None and isinstance(err, EXPECTED[kind])
    ok_named = (K in named) if kind == "skip_collective" else named == [K]
    return {"kind": kind, "class": type(err).__name__ if err else None, "named": named,
            "seconds_to_report": round(elapsed, 2), "leftover_pids": left,
            "misattributed": not (ok_class and ok_named), "summary": err.summary() if err else None}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", default="cpu")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--timeout", type=float, default=8.0)
    p.add_argument("--kill-after", type=float, default=2.0)
    p.add_argument("--kinds", default="raise,exit,sleep,skip_collective,sigkill")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    kinds = args.kinds.split(",")
    rows = []
    for i in range(args.runs):
        rows.append(one(args.runtime, kinds[i % len(kinds)], args.timeout, args.kill_after))
        r = rows[-1]
        print(f"{i:3d} {r['kind']:16s} {r['class']!s:15s} named={r['named']} {r['seconds_to_report']:6.2f}s"
              f"{' MISATTRIBUTED' if r['misattributed'] else ''}{' LEFTOVER' if r['leftover_pids'] else ''}",
              flush=True)
    by_kind = {}
    for k in kinds:
        rs = [r for r in rows if r["kind"] == k]
        if rs:
            secs = [r["seconds_to_report"] for r in rs]
            by_kind[k] = {"runs": len(rs), "median_s": statistics.median(secs), "max_s": max(secs),
                          "misattributed": sum(r["misattributed"] for r in rs),
                          "classes": sorted({r["class"] for r in rs if r["class"]})}
    result = {"runtime": args.runtime, "runs": len(rows), "timeout_s": args.timeout,
              "leftover_processes": sum(len(r["leftover_pids"]) for r in rows),
              "misattributed": sum(r["misattributed"] for r in rows), "by_kind": by_kind, "rows": rows}
    for k, v in by_kind.items():
        print(f"{k:16s} runs {v['runs']:3d}  median {v['median_s']:.2f} s  max {v['max_s']:.2f} s  "
              f"misattributed {v['misattributed']}  {v['classes']}")
    print(f"leftover processes: {result['leftover_processes']}; misattributed: {result['misattributed']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
