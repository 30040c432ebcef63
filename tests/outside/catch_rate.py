"""Measure the kit's catch rate on the outside DDPs (tests/outside/catalog.py).

For every catalog entry it runs one command (cwd = repo root, this interpreter), bounded by a
timeout (the whole process group is killed on expiry), and records exit code, wall time (s) and
the first failing verdict lines:

  --face main    python -m conformance run --runtime cpu --ddp tests.outside.<mod>:<Class> --json <tmp>
  --face pytest  python -m pytest --pyargs <PYTEST_TARGETS> <PYTEST_DDP_OPTION> <ddp> -m cpu -q

(the kit applies its own findings in torch and gloo, and the backend's verdicts do not decide a
DDP's exit code: a user passes no other flag, and neither does this script)

Catch rate = faulty entries that exit 1 / faulty entries; ``correct_passed`` = CorrectDDP exits 0.
Exit code: 0 when CorrectDDP passed (or was not run) and every run finished, 1 otherwise; the
catch rate itself never fails the script (it is a measurement).

  python tests/outside/catch_rate.py --together   # one run, --exitfirst-each: where each is caught
  python tests/outside/catch_rate.py [--face main|pytest] [--only a,b] [--timeout 600]
      [--extra-args "--world-size 2,4"] [--out tests/outside/results/catch_rate.json]
"""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from conformance.verdict import BAD  # noqa: E402
from tests.outside.catalog import CATALOG, BY_NAME  # noqa: E402

# The kit's pytest option naming the DDP under test (may become "--conformance-ddp").
PYTEST_DDP_OPTION = "--conformance-ddp"
# What the pytest face runs: the DDP-dependent modules, without the kit's own mutant tests
# (they do not depend on --ddp). Override with --pytest-args.
PYTEST_TARGETS = ["conformance"]
PYTEST_DEFAULT_ARGS = ["-k", "test_case", "-p", "no:cacheprovider"]
DEFAULT_TIMEOUT_S = 600
FAILED_LINES_KEPT = 8


def main_command(ddp, json_path, extra):
    return [sys.executable, "-m", "conformance", "run", "--runtime", "cpu", "--ddp", ddp,
            "--json", json_path] + extra


def pytest_command(ddp, extra, pytest_args):
    return ([sys.executable, "-m", "pytest", "--pyargs", *PYTEST_TARGETS, PYTEST_DDP_OPTION, ddp,
             "-m", "cpu", "-q"] + pytest_args + extra)


def run_bounded(cmd, timeout_s):
    """Run cmd in its own process group; on timeout kill that group. Returns (rc, out, err, s)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return rc, out, err, round(time.monotonic() - t0, 1)


def failing_lines(face, out, json_path):
    """The first verdict lines that are not pass/unsupported/skip (main) or FAILED lines (pytest)."""
    lines = []
    if face == "main" and json_path and Path(json_path).exists():
        try:
            for v in json.loads(Path(json_path).read_text()).get("verdicts", []):
                if v.get("status") not in ("pass", "unsupported", "skip"):
                    lines.append(f"{v.get('check')} {v.get('model')} W={v.get('world_size')} "
                                 f"{v.get('status')} max_dev={v.get('max_dev')} "
                                 f"first_bad_step={v.get('first_bad_step')} {v.get('reason', '')}")
        except (ValueError, OSError) as exc:
            lines.append(f"unreadable JSON: {exc}")
    elif face == "pytest":
        lines = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))]
    return lines[:FAILED_LINES_KEPT]


def measure(entry, face, timeout_s, extra, pytest_args):
    with tempfile.TemporaryDirectory(prefix="outside-") as tmp:
        json_path = os.path.join(tmp, "run.json") if face == "main" else None
        cmd = (main_command(entry.ddp, json_path, extra) if face == "main"
               else pytest_command(entry.ddp, extra, pytest_args))
        rc, out, err, wall = run_bounded(cmd, timeout_s)
        fails = failing_lines(face, out, json_path)
        if json_path:
            cmd = [c if c != json_path else "<tmp>/run.json" for c in cmd]
    expected = 1 if entry.faulty else 0
    return {
        "name": entry.name, "ddp": entry.ddp, "letter": entry.letter, "kind": entry.kind,
        "dimension": entry.dimension, "source": entry.source,
        "command": " ".join(["python"] + [shlex.quote(c) for c in cmd[1:]]),  # no machine paths
        "exit_code": rc, "timed_out": rc is None, "wall_s": wall, "expected_exit": expected,
        "as_expected": rc == expected, "failing": fails,
        "stderr_tail": err.strip().splitlines()[-3:] if rc not in (0, 1) else [],
    }


def measure_together(entries, timeout_s, extra):
    """One main command over every entry (``--ddp a,b,... --exitfirst-each``): one world per
    world size and the reference runs shared, each DDP stopped at its first failure. Returns
    ``(per-entry dicts as measure()'s, with exit_code 1 when that DDP got a fail/vacuous
    verdict and 0 otherwise, or None for every entry when the run gave no report; the run's
    dict: exit_code, wall_s, stderr_tail)``."""
    with tempfile.TemporaryDirectory(prefix="outside-") as tmp:
        json_path = os.path.join(tmp, "run.json")
        cmd = main_command(",".join(e.ddp for e in entries), json_path,
                           ["--exitfirst-each", "--quiet"] + extra)
        rc, out, err, wall = run_bounded(cmd, timeout_s)
        try:
            doc = json.loads(Path(json_path).read_text())
        except (OSError, ValueError):
            doc = {}
        verdicts = doc.get("verdicts")
        stopped = doc.get("stopped_at_each", {})
    run = {"exit_code": rc, "wall_s": wall, "timed_out": rc is None,
           "stderr_tail": err.strip().splitlines()[-5:] if rc not in (0, 1) else []}
    results = []
    for e in entries:
        mine = [v for v in verdicts or () if v.get("impl") == e.ddp]
        bad = [v for v in mine if v.get("status") in BAD]
        code = None if verdicts is None else int(bool(bad))
        expected = 1 if e.faulty else 0
        results.append({
            "name": e.name, "ddp": e.ddp, "exit_code": code, "expected_exit": expected,
            "as_expected": code == expected, "verdicts": len(mine),
            "stopped_at": stopped.get(e.ddp),
            "failing": [f"{v.get('id')} {v.get('status')} {v.get('reason', '')}"[:300]
                        for v in bad[:FAILED_LINES_KEPT]]})
    return results, run


def summarize(results, face, args):
    faulty = [r for r in results if r["expected_exit"] == 1]
    caught = [r for r in faulty if r["exit_code"] == 1]
    correct = [r for r in results if r["expected_exit"] == 0]
    return {
        "face": face, "timeout_s": args.timeout, "extra_args": args.extra_args,
        "measured_under": "shared 2-core machine (wall times are not benchmarks)",
        "faulty_total": len(faulty), "faulty_caught": len(caught),
        "catch_rate": round(len(caught) / len(faulty), 3) if faulty else None,
        "correct_passed": all(r["exit_code"] == 0 for r in correct) if correct else None,
        "results": results,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--face", choices=("main", "pytest"), default="main")
    ap.add_argument("--only", default="", help="comma list of catalog names")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per run")
    ap.add_argument("--extra-args", default="", help="appended to every command")
    ap.add_argument("--pytest-args", default=" ".join(shlex.quote(a) for a in PYTEST_DEFAULT_ARGS),
                    help="pytest face only: replaces the default selection args")
    ap.add_argument("--together", action="store_true",
                    help="main face: one run over every selected entry (--exitfirst-each), printing "
                    "where each faulty one was stopped (catalog.CAUGHT_BY); exit 1 unless each "
                    "faulty entry is caught and each correct one passes")
    ap.add_argument("--out", default=str(REPO / "tests/outside/results/catch_rate.json"))
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        print(f"error: unknown catalog names {unknown}", file=sys.stderr)
        return 2
    entries = [BY_NAME[n] for n in names] if names else CATALOG
    if args.together:
        results, run = measure_together(entries, args.timeout, shlex.split(args.extra_args))
        for r in results:
            print(f"{r['name']:30s} {'ok' if r['as_expected'] else 'WRONG'} "
                  f"stopped_at={r['stopped_at']}", flush=True)
        print(f"one run: exit {run['exit_code']}, {run['wall_s']} s {run['stderr_tail']}")
        return 0 if all(r["as_expected"] for r in results) else 1
    results = []
    for e in entries:
        r = measure(e, args.face, args.timeout, shlex.split(args.extra_args),
                    shlex.split(args.pytest_args))
        results.append(r)
        print(f"{e.name:26s} exit={r['exit_code']} expected={r['expected_exit']} "
              f"{r['wall_s']:7.1f}s {'ok' if r['as_expected'] else 'MISSED' if e.faulty else 'BAD'}"
              + (f"  {r['failing'][0]}" if r["failing"] else ""), flush=True)
    summary = summarize(results, args.face, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"catch rate ({args.face}): {summary['faulty_caught']}/{summary['faulty_total']} = "
          f"{summary['catch_rate']}; correct passed: {summary['correct_passed']}; JSON: {out}")
    finished = all(r["exit_code"] is not None for r in results)
    return 0 if finished and summary["correct_passed"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
