"""``python -m conformance run --repeat N``: flakiness sweep of the correct implementations.

Reruns every (runtime, world size, implementation, model) of the run N times,
repetition k with the tolerance table's seed + k (a :class:`RunSpec` ``seed``
override; k = 0 is the plain run), on the same persistent worlds, and reports
every verdict that is not ``pass`` / ``unsupported`` / ``skip`` with its seed.
Per cell it keeps the worst deviation and the smallest margin (atol / max dev)
seen. ``--time-budget S`` stops at the first repetition boundary after S seconds
and says how many repetitions completed. Exit 1 when any verdict failed or was
vacuous, else 0 (also when the budget cut the sweep short: that is printed).
"""
from __future__ import annotations

import json
import math
import sys
import time


def _parity_cases(args):
    """The parity cases ``--only`` / ``--skip`` select (``--repeat`` sweeps seeds of
    the standard training run)."""
    from .cases import select
    from .errors import split_list
    return [c for c in select(split_list(args.only), split_list(args.skip)) if c.family == "parity"]


def cmd_repeat(args) -> int:
    from .calibrate import ParityRunner
    from .errors import UsageError
    from .evaluate import Session
    from .options import parse_targets
    from .report import environment
    from .tolerances import lookup
    from .world import WorldPool

    n = args.repeat
    if n < 1:
        raise UsageError(f"--repeat: need N >= 1, got {n}")
    if args.launcher == "env":
        raise UsageError("--repeat runs on worlds the kit spawns; it cannot run under --launcher env")
    if args.mutants:
        raise UsageError("--repeat reruns the correct implementations; drop --mutants")
    targets = parse_targets(args.runtime, args.world_size, args.ddp)
    models = [c.model for c in _parity_cases(args)]
    for _, _, impls in targets:
        for impl in impls:
            if impl.startswith("mutant:"):
                raise UsageError(f"--repeat: {impl} is a mutant; --repeat measures correct implementations")

    runner = ParityRunner(Session(WorldPool()))
    cells: dict = {}
    failures, done, runs = [], 0, 0
    t0 = time.monotonic()
    budget = args.time_budget
    try:
        for k in range(n):
            if budget is not None and done and time.monotonic() - t0 > budget:
                break
            for rt, w, impls in targets:
                for model in models:
                    seed = lookup(rt, model).seed + k
                    for impl in impls:
                        vs = runner.verdicts(rt, w, impl, model, seed=seed)
                        runner.forget()
                        runs += 1
                        for v in vs.values():
                            key = (rt, w, impl, model, v.check)
                            c = cells.setdefault(key, {"runtime": rt, "world_size": w, "impl": impl,
                                                       "model": model, "check": v.check, "runs": 0,
                                                       "statuses": {}, "worst_max_dev": 0.0,
                                                       "worst_seed": None, "atol": v.atol})
                            c["runs"] += 1
                            c["statuses"][v.status] = c["statuses"].get(v.status, 0) + 1
                            if math.isfinite(v.max_dev) and v.max_dev >= c["worst_max_dev"]:
                                c["worst_max_dev"], c["worst_seed"] = v.max_dev, seed
                            if v.status in ("fail", "vacuous"):
                                failures.append(dict(v.to_json(), seed=seed))
                                print(f"NOT PASSING at seed {seed}: {v.summary()}", flush=True)
            done += 1
            if done % 10 == 0 or done == n:
                print(f"repeat {done}/{n}: {runs} runs, {len(failures)} non-passing verdicts, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        runner.close()
    wall = time.monotonic() - t0
    for c in cells.values():
        c["min_margin"] = (c["atol"] / c["worst_max_dev"]) if c["worst_max_dev"] > 0 else None
    head = ("runtime", "W", "impl", "model", "check", "runs", "statuses", "worst_dev", "seed", "min_margin")
    rows = [head] + [(c["runtime"], str(c["world_size"]), c["impl"], c["model"], c["check"], str(c["runs"]),
                      ",".join(f"{s}:{k}" for s, k in sorted(c["statuses"].items())),
                      f"{c['worst_max_dev']:.3g}", str(c["worst_seed"]),
                      "inf" if c["min_margin"] is None else f"{c['min_margin']:.3g}")
                     for c in cells.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    print("\n".join("  ".join(x.ljust(wd) for x, wd in zip(r, widths)) for r in rows))
    cut = done < n
    print(f"\n{done}/{n} repetitions ({runs} training runs, {sum(c['runs'] for c in cells.values())} verdicts) "
          f"in {wall:.0f} s" + (f" - stopped by --time-budget {budget:g} s" if cut else "")
          + f"; {len(failures)} non-passing verdict(s)" + ("" if failures else ": no flakiness seen"))
    doc = {"kit": "ddp-conformance", "kind": "repeat",
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "environment": environment(),
           "requested": n, "completed": done, "stopped_by_budget": cut, "wall_seconds": round(wall, 1),
           "seeds": "table seed + k, k = 0..completed-1", "cells": list(cells.values()),
           "failures": failures}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"JSON report: {args.json}")
    return 1 if failures else 0
