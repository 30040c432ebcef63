#!/usr/bin/env python
"""Where the default run's time goes: the main command's wall time, its case seconds per family,
the fixed cost around them, the machine's core-seconds, and world start-up, with hosts forked
from the fork server or spawned as fresh interpreters (``CONFORMANCE_HOST_START``) and one or
more lanes (``--lanes``, conformance/cli/lanes.py), and ``XLA_FLAGS`` variants (``--xla-flags``).

For each runtime (``--runtimes``), host start (``--starts``) and lane count (``--lanes``),
interleaved ``--times`` rounds of::

    python -m conformance run --runtime RT --ddp IMPL --lanes N --quiet --json J --junitxml X

Per run: wall seconds (the whole subprocess), exit code, verdict counts, case seconds per family
(one case run = one (case, implementation, world size); its seconds are the sum of its verdicts'
JUnit ``time``, which shares the case's evaluation time among them), ``fixed_s`` = wall - the
sum of case seconds (interpreter, imports, world starts not hidden behind a case, report
writing; one lane only: with several, case runs overlap and their sum exceeds the wall time),
the whole machine's busy, idle and stolen core-seconds over the run (``/proc/stat``; the cores
are shared, so a busy neighbour shows), and whether the verdicts equal the first run's (status
and figures of every verdict id). ``--world-starts N``: seconds to start and to close a
:class:`conformance.worlds.spawned.World` of W = 2, 3, 4 in one fresh process, N times each (the
first start of a fork server includes the server's own imports: ``first_start_s``).

The JSON (``--out``, rewritten after every measurement) records the load average before and after
each run: the cores are shared. A script, not a test::

    python benchmarks/default_run.py --runtimes cpu --times 3
    python benchmarks/default_run.py --runtimes cpu --starts forkserver --lanes 1,2 --world-starts 0
    python benchmarks/default_run.py --runtimes pjrt --python PJRT_ENV/bin/python --times 2
    python benchmarks/default_run.py --runtimes pjrt --python PJRT_ENV/bin/python --starts forkserver \
        --xla-flags="" --xla-flags=--xla_cpu_parallel_codegen_split_count=32 --world-starts 0

Exit 0 when every measurement completed (a run whose verdicts failed still completed), 1 when
one did not, 2 on bad input (one ``error:`` line).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "default-run.json")
STARTS = ("forkserver", "spawn")

WORLD_WORKER = """
import json, sys, time
from conformance.settings import Settings
from conformance.worlds.spawned import World
rt, times = sys.argv[1], int(sys.argv[2])
out = []
if __name__ == "__main__":
    for i in range(times):
        for w in (2, 3, 4):
            t0 = time.monotonic(); world = World(rt, w, settings=Settings.from_env()); t1 = time.monotonic()
            world.close(); t2 = time.monotonic()
            out.append({"world_size": w, "start_s": round(t1 - t0, 3), "close_s": round(t2 - t1, 3)})
    print(json.dumps(out))
"""


class BadInput(Exception):
    pass


def case_seconds(junit_path: str) -> dict:
    """``{family: seconds}`` and the case-run count from a run's JUnit XML."""
    per = {}
    for tc in ET.parse(junit_path).iter("testcase"):
        m = re.search(r"\[(.*)\]", tc.get("name", ""))
        key = (tc.get("classname"), m.group(1) if m else "")
        per[key] = per.get(key, 0.0) + float(tc.get("time") or 0)  # shared among its verdicts
    fam = collections.Counter()
    for (case, _), s in per.items():
        fam[case.split(".")[0]] += s
    return {"families": {k: round(v, 2) for k, v in fam.most_common()}, "case_runs": len(per),
            "cases_s": round(sum(per.values()), 2)}


def verdict_digest(json_path: str) -> dict:
    doc = json.load(open(json_path))
    return {v["id"]: [v["status"], v.get("max_dev")] for v in doc["verdicts"]}, doc["counts"]


def core_seconds() -> dict | None:
    """The machine's busy / idle / stolen core-seconds since boot (``/proc/stat``; ``None``
    where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return {"busy": (user + nice + system + irq + softirq) / tick, "idle": (idle + iowait) / tick, "steal": steal / tick}


def one_run(python, runtime, impl, start, lanes, timeout, tmp, xla_flags=None, root=ROOT) -> tuple[dict, dict | None]:
    """The main command over ``impl`` with the kit at ``root`` (a checkout); the row and the verdict digest."""
    j, x = os.path.join(tmp, "run.json"), os.path.join(tmp, "run.xml")
    for p in (j, x):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ, CONFORMANCE_HOST_START=start, PYTHONPATH=root)
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    cmd = [python, "-m", "conformance", "run", "--runtime", runtime, "--ddp", impl, "--lanes", str(lanes),
           "--quiet", "--json", j, "--junitxml", x]
    row = {"runtime": runtime, "impl": impl, "host_start": start, "lanes": lanes, "load_before": os.getloadavg()[0]}
    if xla_flags is not None:
        row["xla_flags"] = xla_flags
    cores0 = core_seconds()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=timeout)
        row["exit"] = proc.returncode
    except subprocess.TimeoutExpired:
        row["exit"], row["error"] = None, f"timed out after {timeout:.0f} s"
        return row, None
    row["wall_s"] = round(time.monotonic() - t0, 2)
    row["load_after"] = os.getloadavg()[0]
    cores1 = core_seconds()
    if cores0 and cores1:
        row["core_s"] = {k: round(cores1[k] - cores0[k], 1) for k in cores0}
    if not os.path.exists(j):
        row["error"] = (proc.stderr or proc.stdout)[-500:]
        return row, None
    digest, row["counts"] = verdict_digest(j)
    row.update(case_seconds(x))
    row["fixed_s"] = round(row["wall_s"] - row["cases_s"], 2) if lanes == 1 else None
    return row, digest


def world_starts(python, runtime, start, times, timeout) -> dict:
    env = dict(os.environ, CONFORMANCE_HOST_START=start, PYTHONPATH=ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worlds.py")
        with open(script, "w") as f:
            f.write(WORLD_WORKER)
        proc = subprocess.run([python, script, runtime, str(times)], env=env, capture_output=True,
                              text=True, timeout=timeout, cwd=tmp)
    if proc.returncode != 0:
        return {"runtime": runtime, "host_start": start, "error": proc.stderr[-500:]}
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    out = {"runtime": runtime, "host_start": start, "first_start_s": rows[0]["start_s"], "rows": rows}
    for w in (2, 3, 4):
        later = sorted(r["start_s"] for r in rows[1:] if r["world_size"] == w)
        closes = sorted(r["close_s"] for r in rows if r["world_size"] == w)
        out[f"w{w}_start_median_s"] = later[len(later) // 2] if later else None
        out[f"w{w}_close_median_s"] = closes[len(closes) // 2]
    return out


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runtimes", default="cpu", help="comma list: cpu, pjrt (default cpu)")
    p.add_argument("--python", default=sys.executable, help="interpreter (torch_xla for pjrt)")
    p.add_argument("--ddp", default="ref", help="implementation (default ref)")
    p.add_argument("--starts", default=",".join(STARTS), help="comma list of host starts: forkserver, spawn")
    p.add_argument("--lanes", default="2", help="comma list of lane counts (default 2, the CLI's)")
    p.add_argument("--xla-flags", action="append", default=None, metavar="FLAGS",
                   help="an XLA_FLAGS value for the runs (repeat: one more variant, interleaved); a flag "
                        "set here wins over the kit's FAST_COMPILE_FLAGS (default: the environment's)")
    p.add_argument("--times", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--world-starts", type=int, default=3, help="world starts per size (0: none)")
    p.add_argument("--timeout", type=float, default=1800, help="bound on each run, s")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON output (default benchmarks/results/default-run.json)")
    args = p.parse_args(argv)
    starts = args.starts.split(",")
    if set(starts) - set(STARTS) or args.times < 1 or args.world_starts < 0:
        raise BadInput(f"--starts takes {', '.join(STARTS)}; --times >= 1, --world-starts >= 0")
    try:
        args.lanes = [int(n) for n in args.lanes.split(",")]
    except ValueError:
        raise BadInput(f"--lanes {args.lanes}: not a comma list of whole numbers") from None
    if not all(1 <= n <= 8 for n in args.lanes):
        raise BadInput("--lanes: each from 1 to 8")
    args.starts, args.runtimes = starts, args.runtimes.split(",")
    if os.sep in args.python:  # the runs start in a temporary folder
        args.python = os.path.abspath(args.python)
    if not os.access(args.python, os.X_OK) and not shutil.which(args.python):
        raise BadInput(f"--python {args.python}: no such interpreter")
    return args


def main(argv=None) -> int:
    try:
        args = parse(argv)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
           "runs": [], "worlds": []}
    ok = True

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    first = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rt in args.runtimes:
            for _ in range(args.times):
                for start, lanes, flags in [(st, n, f) for st in args.starts for n in args.lanes
                                            for f in (args.xla_flags or [None])]:
                    row, digest = one_run(args.python, rt, args.ddp, start, lanes, args.timeout, tmp, flags)
                    if digest is None:
                        ok = False
                    else:
                        row["verdicts_as_first_run"] = first.setdefault(rt, digest) == digest
                    doc["runs"].append(row)
                    save()
                    print(json.dumps({k: row.get(k) for k in ("runtime", "host_start", "lanes", "xla_flags", "wall_s", "exit",
                                                               "cases_s", "fixed_s", "core_s",
                                                               "verdicts_as_first_run")}), flush=True)
            if args.world_starts:
                for start in args.starts:
                    w = world_starts(args.python, rt, start, args.world_starts, args.timeout)
                    ok = ok and "error" not in w
                    doc["worlds"].append(w)
                    save()
                    print(json.dumps({k: v for k, v in w.items() if k != "rows"}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
