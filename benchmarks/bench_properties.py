#!/usr/bin/env python
"""Property checks on a persistent world vs a fresh process group per example.

Examples/second of property 1 (``allreduce_mean``, see
``conformance/cases/property/kind.py``) evaluated two ways on the same
examples:

* **persistent** - one :class:`conformance.worlds.spawned.World` started once (its
  start-up time is reported separately), every example is one ``world.run``
  plus the oracle, as the pytest suite does;
* **fresh** - a new ``World`` (new replica processes, new gloo process group)
  is started for each example, the example runs, the world is closed.

The examples are drawn once, deterministically (Hypothesis, derandomized), and
the persistent side runs the list ``--repeat`` times (the fresh side once; it
is slow). Each example runs through the oracle, so a wrong answer aborts the
benchmark. A script, not a test; run from the repository root::

    python benchmarks/bench_properties.py [--examples 20] [--repeat 10] [--impl ref]

Writes JSON to ``--out`` (default ``benchmarks/results/properties.json``) with
both rates, their ratio, and the machine load (1-minute load average before and
after each side: other processes share the cores).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: make `conformance` importable
    sys.path.insert(0, ROOT)

DEFAULT_OUT = os.path.join("benchmarks", "results", "properties.json")


def draw_examples(n: int, world_size: int, dtypes) -> list:
    """``n`` property-1 examples, the same on every call (derandomized Hypothesis)."""
    from hypothesis import HealthCheck, Phase, given, settings

    from conformance.cases.property.strategies import allreduce_examples
    out = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(ex=allreduce_examples(world_size, dtypes))
    def collect(ex):
        out.append(ex)
    collect()
    return out[:n]


def one_example(world, impl: str, ex) -> None:
    from conformance.cases.property.oracles import check_allreduce_mean
    from conformance.cases.property.tasks import allreduce_mean_task
    check_allreduce_mean(ex, world.run(allreduce_mean_task, impl=impl, **ex.payload()))


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def bench_persistent(runtime, world_size, impl, examples, repeat) -> dict:
    from conformance.worlds.spawned import World
    load0 = loadavg()
    t0 = time.perf_counter()
    world = World(runtime, world_size)
    startup = time.perf_counter() - t0
    try:
        one_example(world, impl, examples[0])  # warm-up (first DDP construction, imports)
        t0 = time.perf_counter()
        for _ in range(repeat):
            for ex in examples:
                one_example(world, impl, ex)
        secs = time.perf_counter() - t0
    finally:
        world.close()
    runs = repeat * len(examples)
    return {"runs": runs, "seconds": secs, "examples_per_s": runs / secs,
            "startup_s": startup, "loadavg_before": load0, "loadavg_after": loadavg()}


def bench_fresh(runtime, world_size, impl, examples) -> dict:
    from conformance.worlds.spawned import World
    load0 = loadavg()
    start = run = close = 0.0
    t0 = time.perf_counter()
    for ex in examples:
        s0 = time.perf_counter()
        world = World(runtime, world_size)
        s1 = time.perf_counter()
        try:
            one_example(world, impl, ex)
        finally:
            s2 = time.perf_counter()
            world.close()
        start, run, close = start + s1 - s0, run + s2 - s1, close + time.perf_counter() - s2
    secs = time.perf_counter() - t0
    n = len(examples)
    return {"runs": n, "seconds": secs, "examples_per_s": n / secs,
            "mean_start_s": start / n, "mean_run_s": run / n, "mean_close_s": close / n,
            "loadavg_before": load0, "loadavg_after": loadavg()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runtime", default="cpu")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--impl", default="ref", help="DDP under test (a --ddp spec)")
    p.add_argument("--examples", type=int, default=20, help="distinct examples (both sides)")
    p.add_argument("--repeat", type=int, default=10, help="passes over the examples, persistent side")
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args(argv)

    import numpy as np
    import torch

    from conformance.cases.shared.numerics import ALLREDUCE_DTYPES, DEFAULT_ALLREDUCE_DTYPES
    dtypes = ALLREDUCE_DTYPES.get(args.runtime, DEFAULT_ALLREDUCE_DTYPES)
    examples = draw_examples(args.examples, args.world_size, dtypes)
    sizes = [int(np.prod(ex.shape, dtype=np.int64)) for ex in examples]
    print(f"{len(examples)} examples, elements per tensor: median {int(np.median(sizes))}, max {max(sizes)}",
          flush=True)
    persistent = bench_persistent(args.runtime, args.world_size, args.impl, examples, args.repeat)
    print(f"persistent: {persistent['examples_per_s']:.1f} examples/s "
          f"({persistent['runs']} runs, start-up {persistent['startup_s']:.2f} s)", flush=True)
    fresh = bench_fresh(args.runtime, args.world_size, args.impl, examples)
    print(f"fresh world per example: {fresh['examples_per_s']:.3f} examples/s "
          f"(mean per example: start {fresh['mean_start_s']:.2f} s, first run {fresh['mean_run_s']:.2f} s, "
          f"close {fresh['mean_close_s']:.2f} s)", flush=True)
    ratio = persistent["examples_per_s"] / fresh["examples_per_s"]
    print(f"ratio persistent / fresh: {ratio:.0f}x")
    result = {
        "property": "allreduce_mean", "runtime": args.runtime, "world_size": args.world_size,
        "impl": args.impl, "examples": len(examples), "dtypes": list(dtypes),
        "elements_per_tensor": {"median": int(np.median(sizes)), "max": max(sizes)},
        "persistent": persistent, "fresh": fresh, "ratio_persistent_over_fresh": ratio,
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpus": os.cpu_count(), "platform": platform.platform()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
