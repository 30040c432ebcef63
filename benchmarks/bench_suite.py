#!/usr/bin/env python
"""Suite figures: wall time of the main command, world start-up, memory, RSS over a sweep.

Parts (``--only``, comma list; default all):

* ``cli`` - wall time (s, the whole subprocess: interpreter, worlds, report) of
  ``python -m conformance run --runtime cpu --world-size 2 --ddp ref --quiet
  --only <family>`` for each case family and of the full table, on CPU; and the
  full table on PJRT W=2. Each row records the command, seconds, exit code and
  the verdict counts of its JSON report.
* ``worlds`` - seconds to start a :class:`conformance.worlds.spawned.World` (hosts spawned,
  runtime set up, every replica ready) and to close it, CPU and PJRT, W=2 and W=4,
  ``--world-starts`` times each in a fresh process.
* ``memory`` - peak resident set (VmHWM, MiB) of every host process of a CPU W=4
  world and of the PJRT W=8 host process after the parity cases ran on them
  (reference DDP), and of the parent process (it computes the reference runs).
* ``repeat`` - ``python -m conformance run --repeat N --runtime cpu --world-size 2
  --ddp ref --only parity.linear`` (bounded by ``--repeat-budget``): each replica
  host's RSS (MiB) when the world started, after repetition 1 and at the end, and
  the growth.

PJRT measurements run under ``--pjrt-python`` (an interpreter with torch_xla;
default this one), CPU ones under ``--cpu-python``; both import the kit from this
checkout (``PYTHONPATH``). Every measurement is a subprocess bounded by
``--timeout``; a failure (timeout, crash, runtime missing) is recorded in the JSON
and the rest still runs. The JSON (``--out``, rewritten after every measurement)
holds the load average (``os.getloadavg()``) before and after each measurement:
other processes share the cores. A script, not a test; run from anywhere::

    nice -n 10 python benchmarks/bench_suite.py --pjrt-python PJRT_VENV/bin/python
    python benchmarks/bench_suite.py --only worlds,memory --out /tmp/suite.json

Exit 0 when every measurement completed (a run whose verdicts failed still
completed: its exit code is recorded), 1 when some measurement failed, 2 on bad
input (one ``error:`` line).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: make `conformance` importable
    sys.path.insert(0, ROOT)

DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "suite.json")
PARTS = ("cli", "worlds", "memory", "repeat")
IMPL = "ref"
WORLD_STARTS = ((("cpu", 2), ("cpu", 4)), (("pjrt", 2), ("pjrt", 4)))
MEMORY_WORLDS = (("cpu", 4), ("pjrt", 8))


class BadInput(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise BadInput(message)


def loadavg() -> list | None:
    """1-, 5- and 15-minute load averages (runnable processes), or ``None``."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# --- measurements in a fresh process (``bench_suite.py _worker ...``) -------------------

def worker_worlds(runtime: str, world_size: int, times: int) -> dict:
    """Start and close a world ``times`` times; seconds of each start and close."""
    from conformance.report.text import environment
    from conformance.worlds.spawned import World
    start, close = [], []
    for _ in range(times):
        t0 = time.perf_counter()
        world = World(runtime, world_size)
        t1 = time.perf_counter()
        world.close()
        start.append(round(t1 - t0, 3))
        close.append(round(time.perf_counter() - t1, 3))
    return {"start_s": start, "close_s": close, "environment": environment()}


def worker_memory(runtime: str, world_size: int) -> dict:
    """Run the parity cases (reference DDP) on one world; peak RSS (MiB) of its hosts
    and of this process, read before the world closes."""
    from conformance.cases.table import select
    from conformance.evaluate import Session, evaluate
    from conformance.worlds.procmem import peak_rss_mib, rss_mib
    from conformance.report.text import counts, environment
    from conformance.worlds.pool import WorldPool

    class Pool(WorldPool):  # remembers the world in use (a failure replaces it)
        def get(self, world):
            self.last = super().get(world)
            return self.last

    pool = Pool()
    session = Session(pool)
    t0 = time.perf_counter()
    try:
        verdicts = [v for c in select(["parity"], []) for v in evaluate(c, IMPL, runtime, world_size, session)]
        seconds = time.perf_counter() - t0
        world = getattr(pool, "last", None)
        hosts = [] if world is None else [
            {"host": i, "pid": pid, "peak_rss_mib": peak_rss_mib(pid), "rss_mib": rss_mib(pid)}
            for i, pid in enumerate(world.pids())]
        return {"cases": sorted({v.case for v in verdicts}),
                "counts": {s: n for s, n in counts(verdicts).items() if n},
                "seconds": round(seconds, 1), "world_restarted": bool(world and world.broken),
                "hosts": hosts, "parent_peak_rss_mib": peak_rss_mib(os.getpid()),
                "parent_rss_mib": rss_mib(os.getpid()), "environment": environment()}
    finally:
        session.close()


def worker_main(argv) -> int:
    """``_worker worlds RUNTIME W TIMES`` or ``_worker memory RUNTIME W``: one JSON line on stdout."""
    kind, runtime, w = argv[0], argv[1], int(argv[2])
    out = worker_worlds(runtime, w, int(argv[3])) if kind == "worlds" else worker_memory(runtime, w)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# --- the driver ---------------------------------------------------------------------------

def bounded(cmd: list, timeout: float) -> dict:
    """Run ``cmd`` from the checkout in its own process group, killed (with the world
    hosts it started) after ``timeout`` s. Returns seconds, exit code, output, error."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    except OSError as exc:
        return {"seconds": 0.0, "exit_code": None, "stdout": "", "stderr": "", "error": f"cannot start: {exc}"}
    error = None
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:  # timeout, or Ctrl-C here: leave nothing running
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        error = f"timeout after {timeout:g} s (killed)"
    return {"seconds": round(time.perf_counter() - t0, 1), "exit_code": proc.returncode,
            "stdout": out, "stderr": err, "error": error}


def _tail(text: str, n: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def measure(label: str, cmd: list, timeout: float, shown: list) -> tuple[dict, dict]:
    """Run one bounded command; ``(row, raw)``: row has seconds, exit code, load before/after."""
    print(f"... {label}", file=sys.stderr, flush=True)
    row = {"loadavg_before": loadavg()}
    raw = bounded(cmd, timeout)
    row.update(seconds=raw["seconds"], exit_code=raw["exit_code"], loadavg_after=loadavg())
    row["command"] = " ".join(shown)
    if raw["error"]:
        row["error"] = raw["error"]
    return row, raw


def fail_text(raw: dict, what: str) -> str:
    """Why a measurement gave no result; the checkout's path is shortened (the JSON is committed)."""
    text = raw["error"] or f"{what}; exit {raw['exit_code']}; stderr: {_tail(raw['stderr'])}"
    return text.replace(ROOT + os.sep, "")


def part_cli(args, pythons, tmp) -> list:
    from conformance.cases.row import FAMILIES
    runs = [("cpu", f) for f in FAMILIES] + [("cpu", None)] + [("pjrt", None)]
    rows = []
    for rt, only in runs:
        if rt not in pythons:
            continue
        report = os.path.join(tmp, "report.json")
        if os.path.exists(report):
            os.remove(report)
        tail = ["run", "--runtime", rt, "--world-size", "2", "--ddp", IMPL, "--quiet"] + \
            (["--only", only] if only else [])
        row, raw = measure(f"cli {rt} {only or 'full table'}", [pythons[rt], "-m", "conformance", *tail,
                                                                "--json", report],
                           args.timeout, ["python", "-m", "conformance", *tail])
        row = {"runtime": rt, "world_size": 2, "only": only or "(full table)", **row}
        try:
            with open(report) as f:
                doc = json.load(f)
            row["counts"] = {s: n for s, n in doc["counts"].items() if n}
            row["verdicts"] = sum(doc["counts"].values())
            row["environment"] = doc.get("environment")
        except (OSError, ValueError, KeyError) as exc:
            row.setdefault("error", fail_text(raw, f"no JSON report ({exc})"))
        rows.append(row)
        record(args, "cli", rows)
    return rows


def _worker_row(args, python, kind, rt, w, extra=()) -> dict:
    row, raw = measure(f"{kind} {rt} W={w}", [python, os.path.abspath(__file__), "_worker", kind, rt, str(w),
                                              *map(str, extra)],
                       args.timeout, ["python", "benchmarks/bench_suite.py", "_worker", kind, rt, str(w),
                                      *map(str, extra)])
    row = {"runtime": rt, "world_size": w, **row}
    got = [ln for ln in raw["stdout"].splitlines() if ln.startswith("RESULT ")]
    if got and raw["exit_code"] == 0:
        row.update(json.loads(got[-1][len("RESULT "):]))
    else:
        row.setdefault("error", fail_text(raw, "no result"))
    return row


def part_worlds(args, pythons, tmp) -> list:
    rows = []
    for group in WORLD_STARTS:
        for rt, w in group:
            if rt not in pythons:
                continue
            row = _worker_row(args, pythons[rt], "worlds", rt, w, (args.world_starts,))
            if "start_s" in row:
                row["median_start_s"] = statistics.median(row["start_s"])
                row["median_close_s"] = statistics.median(row["close_s"])
            rows.append(row)
            record(args, "worlds", rows)
    return rows


def part_memory(args, pythons, tmp) -> list:
    rows = []
    for rt, w in MEMORY_WORLDS:
        if rt not in pythons:
            continue
        row = _worker_row(args, pythons[rt], "memory", rt, w)
        peaks = [h["peak_rss_mib"] for h in row.get("hosts", []) if h.get("peak_rss_mib") is not None]
        if peaks:
            row["max_host_peak_rss_mib"], row["sum_host_peak_rss_mib"] = max(peaks), round(sum(peaks), 1)
        rows.append(row)
        record(args, "memory", rows)
    return rows


def part_repeat(args, pythons, tmp) -> dict:
    report = os.path.join(tmp, "repeat.json")
    tail = ["run", "--repeat", str(args.repeat), "--runtime", "cpu", "--world-size", "2", "--ddp", IMPL,
            "--only", "parity.linear", "--time-budget", f"{args.repeat_budget:g}"]
    row, raw = measure(f"repeat {args.repeat}", [pythons["cpu"], "-m", "conformance", *tail, "--json", report],
                       args.repeat_budget + args.timeout, ["python", "-m", "conformance", *tail])
    try:
        with open(report) as f:
            doc = json.load(f)
        hosts = doc["host_rss"]
    except (OSError, ValueError, KeyError) as exc:
        row.setdefault("error", fail_text(raw, f"no JSON report with host_rss ({exc})"))
        return row

    def growth(a, b):
        return None if a is None or b is None else round(b - a, 1)
    for h in hosts:
        h["growth_mib"] = growth(h["start_mib"], h["end_mib"])
        h["growth_after_first_mib"] = growth(h["after_first_mib"], h["end_mib"])
    row.update(requested=doc["requested"], completed=doc["completed"], stopped_by_budget=doc["stopped_by_budget"],
               sweep_seconds=doc["wall_seconds"], failures=len(doc["failures"]), host_rss=hosts,
               environment=doc.get("environment"))
    return row


_STATE: dict = {}


def record(args, part: str, value) -> None:
    """Store ``value`` as ``part`` and rewrite the JSON (a killed run keeps what it measured)."""
    _STATE["doc"]["parts"][part] = value
    save(args)


def save(args) -> None:
    doc = _STATE["doc"]
    doc["loadavg_end"] = loadavg()
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def _counts_text(c: dict | None) -> str:
    return ", ".join(f"{n} {s}" for s, n in (c or {}).items()) or "-"


def summary_table(doc: dict) -> str:
    """The short table printed at the end: one line per measurement."""
    lines = []
    for r in doc["parts"].get("cli", []):
        what = f"run {r['runtime']} W=2 --only {r['only']}" if r["only"] != "(full table)" else \
            f"run {r['runtime']} W=2 full table"
        lines.append(("cli", what, f"{r['seconds']:.1f} s, exit {r['exit_code']}, {_counts_text(r.get('counts'))}",
                      r.get("error")))
    for r in doc["parts"].get("worlds", []):
        lines.append(("worlds", f"World({r['runtime']!r}, {r['world_size']})",
                      f"start {r['median_start_s']:.2f} s, close {r['median_close_s']:.2f} s (median of "
                      f"{len(r['start_s'])})" if "start_s" in r else "-", r.get("error")))
    for r in doc["parts"].get("memory", []):
        peaks = " ".join(f"{h['peak_rss_mib']}" for h in r.get("hosts", []))
        lines.append(("memory", f"parity on {r['runtime']} W={r['world_size']}",
                      f"host peak RSS {peaks} MiB; parent {r.get('parent_peak_rss_mib')} MiB" if peaks else "-",
                      r.get("error")))
    r = doc["parts"].get("repeat")
    if r:
        res = "; ".join(f"host {h['host']} {h['start_mib']} -> {h['after_first_mib']} -> {h['end_mib']} MiB "
                        f"({h['growth_mib']:+}, {h['growth_after_first_mib']:+} after rep 1)"
                        for h in r.get("host_rss", []) if h["growth_mib"] is not None and
                        h["growth_after_first_mib"] is not None)
        lines.append(("repeat", f"--repeat {r.get('requested', '?')} parity.linear cpu W=2",
                      f"{r.get('completed')} reps in {r.get('sweep_seconds')} s; {res}" if res else "-",
                      r.get("error")))
    w = [max(len(x[i]) for x in lines) if lines else 0 for i in range(2)]
    return "\n".join(f"{a.ljust(w[0])}  {b.ljust(w[1])}  " + (f"ERROR: {e.splitlines()[-1]}" if e else c)
                     for a, b, c, e in lines)


def main(argv=None) -> int:
    try:
        args, parts, pythons = parse(argv)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _STATE["doc"] = doc = {
        "kit": "ddp-conformance", "kind": "bench_suite", "impl": IMPL,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
        "nice": os.nice(0), "profile": os.environ.get("CONFORMANCE_PROFILE") or "(default)",
        "loadavg_start": loadavg(), "units": {"seconds": "s, wall clock", "rss": "MiB (VmRSS / VmHWM)"},
        "parts": {}}
    try:
        save(args)
    except OSError as exc:
        print(f"error: --out: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    run = {"cli": part_cli, "worlds": part_worlds, "memory": part_memory, "repeat": part_repeat}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        for part in PARTS:
            if part in parts:
                record(args, part, run[part](args, pythons, tmp))
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    save(args)
    print(summary_table(doc))
    print(f"load average (1, 5, 15 min): start {doc['loadavg_start']}, end {doc['loadavg_end']}; "
          f"{doc['cpus']} cpus; {doc['seconds']:.0f} s in all; JSON: {args.out}")
    rows = [r for v in doc["parts"].values() for r in (v if isinstance(v, list) else [v])]
    return 1 if any(r.get("error") for r in rows) else 0


def parse(argv):
    """``(args, parts, {runtime: interpreter})``; raises :class:`BadInput`."""
    p = _Parser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(PARTS), help=f"comma list of parts: {', '.join(PARTS)}")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON output (default benchmarks/results/suite.json)")
    p.add_argument("--runtimes", default="cpu,pjrt", help="comma list: cpu, pjrt (default both)")
    p.add_argument("--cpu-python", default=sys.executable, help="interpreter for CPU measurements")
    p.add_argument("--pjrt-python", default=sys.executable, help="interpreter with torch_xla (PJRT)")
    p.add_argument("--timeout", type=float, default=1800, help="bound on each measurement, s (default 1800)")
    p.add_argument("--world-starts", type=int, default=3, help="starts per world size (default 3)")
    p.add_argument("--repeat", type=int, default=200, help="repetitions of the repeat part (default 200)")
    p.add_argument("--repeat-budget", type=float, default=360, help="--time-budget of the repeat part, s")
    args = p.parse_args(argv)
    parts = [x.strip() for x in args.only.split(",") if x.strip()]
    if not parts or set(parts) - set(PARTS):
        raise BadInput(f"--only: unknown part(s) {', '.join(sorted(set(parts) - set(PARTS))) or '(none given)'}; "
                       f"use {', '.join(PARTS)}")
    runtimes = [x.strip() for x in args.runtimes.split(",") if x.strip()]
    if not runtimes or set(runtimes) - {"cpu", "pjrt"}:
        raise BadInput(f"--runtimes: need a comma list of cpu, pjrt; got {args.runtimes!r}")
    if "repeat" in parts and "cpu" not in runtimes:
        raise BadInput("--only repeat runs on the CPU runtime: add cpu to --runtimes")
    for name in ("timeout", "repeat_budget"):
        if not getattr(args, name) > 0:
            raise BadInput(f"--{name.replace('_', '-')}: need seconds > 0, got {getattr(args, name):g}")
    for name in ("world_starts", "repeat"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')}: need N >= 1, got {getattr(args, name)}")
    pythons = {rt: getattr(args, f"{rt}_python") for rt in runtimes}
    for rt, py in pythons.items():
        if not (os.path.isfile(py) and os.access(py, os.X_OK)):
            raise BadInput(f"--{rt}-python: {py} is not an executable file")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out: cannot create the directory of {args.out}: {exc.strerror}") from None
    if os.path.isdir(args.out):
        raise BadInput(f"--out: {args.out} is a directory")
    return args, parts, pythons


if __name__ == "__main__":
    if sys.argv[1:2] == ["_worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(main())
