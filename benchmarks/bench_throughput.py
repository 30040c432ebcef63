#!/usr/bin/env python
"""Throughput of the reference DDP vs upstream's data-parallel path and vs the synchronous floor.

Examples per second per replica of each implementation on one persistent
:class:`conformance.worlds.spawned.World`, measured with the same model, global batch
and world size for all, in interleaved rounds (each round runs every variant
once, the order rotating from round to round), summarised by the median over
rounds. The floor of a data-parallel step is measured on the same world:
``floor:local`` (forward + backward + SGD step on the local shard, no sync) plus
``floor:allreduce`` (one all-reduce of a flat buffer as large as all gradients).
See :mod:`benchmarks.throughput_tasks` for what one timed run does.

Usage (a script, not a test; run from the repository root)::

    python benchmarks/bench_throughput.py                  # CPU runtime: ref, torch
    python benchmarks/bench_throughput.py --runtime pjrt   # PJRT (torch_xla 2.9 env): ref, xla_recipe
    python benchmarks/bench_throughput.py --global-batch 24,64,96 --profile \
        --impls 'ref,torch,torch[bucket_cap_mb=1]' --quiet-below 0.3

Both write into one JSON file (``--out``, default
``benchmarks/results/throughput.json``): each run replaces its runtime's entry
and keeps the others. Every run records the machine load: the 1-minute load
average before each run and the CPU (in cores) that processes other than the
benchmark used during it (from ``/proc``). ``--quiet-below C`` waits before each
round until other processes use less than ``C`` cores (bounded by
``--quiet-timeout``).

Targets (from the issue): ref's throughput >= 1.05 x upstream's on the same
runtime (``--baseline``: torch's DDP on CPU; on PJRT, where torch's DDP is
unsupported, torch_xla's recipe ``xla_recipe`` when the implementation table has
it), and ref's step time <= 1.10 x the floor. ``floor:fused`` (the floor's
all-reduce issued inside one step) is reported too, as a reachable reference.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: make `benchmarks`, `conformance` importable
    sys.path.insert(0, ROOT)

TARGET_VS_TORCH = 1.05   # ref throughput / upstream (baseline) throughput, same runtime
TARGET_VS_FLOOR = 1.10   # ref step time / floor step time
DEFAULT_OUT = os.path.join("benchmarks", "results", "throughput.json")
FLOORS = ("floor:local", "floor:allreduce", "floor:fused")
# What the JSON keeps of each run without --detail (enough to recompute medians and paired
# ratios; examples/s per replica = local_batch / step_ms * 1000).
RUN_KEYS = ("round", "variant", "step_ms", "load1", "cpu_others_cores", "unsupported")


# --- machine load ----------------------------------------------------------------
_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_ticks() -> int:
    """CPU ticks all cores spent busy since boot (``/proc/stat``; 0 if unavailable)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals[:8]) - idle


def _proc_ticks(pids) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime (all threads)
        except (OSError, IndexError, ValueError):
            pass
    return total


class LoadMeter:
    """CPU used by processes other than ``pids`` (in cores) between start and stop."""

    def __init__(self, pids):
        self.pids = list(pids)

    def start(self):
        self._t, self._busy, self._ours = time.monotonic(), _busy_ticks(), _proc_ticks(self.pids)
        self.load1 = os.getloadavg()[0]

    def stop(self) -> dict:
        dt = max(time.monotonic() - self._t, 1e-6)
        busy = (_busy_ticks() - self._busy) / _TCK / dt
        ours = (_proc_ticks(self.pids) - self._ours) / _TCK / dt
        return {"load1": round(self.load1, 2), "cpu_total_cores": round(busy, 2),
                "cpu_bench_cores": round(ours, 2), "cpu_others_cores": round(max(busy - ours, 0.0), 2)}


def wait_quiet(pids, below, timeout, window=3.0) -> dict:
    """Wait until other processes use < ``below`` cores over ``window`` s (at most ``timeout`` s)."""
    meter = LoadMeter(pids)
    deadline = time.monotonic() + timeout
    while True:
        meter.start()
        time.sleep(window)
        got = meter.stop()
        if got["cpu_others_cores"] < below or time.monotonic() >= deadline:
            got["quiet"] = got["cpu_others_cores"] < below
            return got


# --- variants ----------------------------------------------------------------
def parse_variant(text: str):
    """``[label=]spec[[k=v,...]]`` -> ``(label, spec, kwargs tuple)``; values are Python literals.

    The label defaults to the text itself: ``torch[bucket_cap_mb=1]``,
    ``mine=mypkg.ddp:MyDDP``.
    """
    m = re.fullmatch(r"\s*(?:([\w.-]+)=)?([^\[\]=]+?)\s*(?:\[(.*)\])?\s*", text)
    if not m:
        raise SystemExit(f"error: bad variant {text!r}")
    label, spec, args = m.group(1), m.group(2), m.group(3)
    kwargs = []
    for part in filter(None, (a.strip() for a in (args or "").split(","))):
        key, _, value = part.partition("=")
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        kwargs.append((key.strip(), value))
    return label or text.strip(), spec.strip(), tuple(kwargs)


def _split_variants(text: str):
    """Split on commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [v for v in (o.strip() for o in out) if v]


# --- statistics ----------------------------------------------------------------
def _med(xs):
    return statistics.median(xs) if xs else None


def _q(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _r(x, nd=4):
    return None if x is None else round(x, nd)


def summarise(runs, labels, baseline, subject):
    """Medians per variant, the floor, and the ratios against the targets."""
    by = {lab: [r for r in runs if r["variant"] == lab and "step_ms" in r] for lab in labels + list(FLOORS)}
    summary = {}
    for lab, rs in by.items():
        if not rs:
            continue
        steps = [r["step_ms"] for r in rs]
        phases = list(zip(*[r["phases_ms"] for r in rs]))
        row = {"runs": len(rs), "step_ms_median": _r(_med(steps)), "step_ms_min": _r(min(steps)),
               "step_ms_max": _r(max(steps)), "step_ms_iqr": [_r(_q(steps, .25)), _r(_q(steps, .75))],
               "examples_per_s_per_replica_median": _r(_med([r["examples_per_s_per_replica"] for r in rs]), 1),
               "phases_ms_median": {"forward_loss": _r(_med(phases[0])), "backward": _r(_med(phases[1])),
                                    "after_backward_optimizer": _r(_med(phases[2])),
                                    "mark_step": _r(_med(phases[3]))}}
        prof = [r["allreduce"] for r in rs if r.get("allreduce", {}).get("calls_per_step")]
        if prof:  # only implementations that use the kit's collectives (not torch's DDP)
            per_call = [p["ms_per_call"] for p in prof if p.get("ms_per_call")]
            row["allreduce_profile"] = {"calls_per_step": prof[0]["calls_per_step"],
                                        "numels": prof[0]["numels"],
                                        "ms_per_step_median": _r(_med([p["ms_per_step"] for p in prof])),
                                        "ms_per_call_median": [_r(_med(c)) for c in zip(*per_call)]}
        if any("torch_ddp" in r for r in rs):
            row["torch_ddp"] = rs[-1]["torch_ddp"]
        summary[lab] = row

    rounds = sorted({r["round"] for r in runs})

    def per_round(lab):
        return {r["round"]: r["step_ms"] for r in by.get(lab, [])}

    local, ar = per_round("floor:local"), per_round("floor:allreduce")
    floor = None
    if local and ar:
        paired = [local[k] + ar[k] for k in rounds if k in local and k in ar]
        floor = {"local_ms_median": summary["floor:local"]["step_ms_median"],
                 "allreduce_ms_median": summary["floor:allreduce"]["step_ms_median"],
                 "floor_ms": _r(summary["floor:local"]["step_ms_median"]
                                + summary["floor:allreduce"]["step_ms_median"]),
                 "floor_ms_paired_median": _r(_med(paired))}
        if "floor:fused" in summary:  # informative: the same communication inside one step
            floor["fused_ms_median"] = summary["floor:fused"]["step_ms_median"]
    ratios = {}
    for lab in labels:
        if lab not in summary:
            continue
        mine = per_round(lab)
        row = {}
        if baseline in summary and lab != baseline:
            base = per_round(baseline)
            row["throughput_vs_" + baseline] = _r(summary[baseline]["step_ms_median"]
                                                  / summary[lab]["step_ms_median"])
            row["throughput_vs_" + baseline + "_paired_median"] = _r(
                _med([base[k] / mine[k] for k in rounds if k in base and k in mine]))
        if floor:
            row["step_time_vs_floor"] = _r(summary[lab]["step_ms_median"] / floor["floor_ms"])
            row["step_time_vs_floor_paired_median"] = _r(
                _med([mine[k] / (local[k] + ar[k]) for k in rounds if k in mine and k in local and k in ar]))
        if floor and floor.get("fused_ms_median"):
            row["step_time_vs_fused_floor"] = _r(summary[lab]["step_ms_median"] / floor["fused_ms_median"])
        ratios[lab] = row
    verdict = {}
    if subject in ratios:
        got = ratios[subject]
        key = "throughput_vs_" + baseline
        if key in got:
            verdict["vs_" + baseline] = {"ratio": got[key], "target_at_least": TARGET_VS_TORCH,
                                         "meets": got[key] >= TARGET_VS_TORCH}
        if "step_time_vs_floor" in got:
            verdict["vs_floor"] = {"ratio": got["step_time_vs_floor"], "target_at_most": TARGET_VS_FLOOR,
                                   "meets": got["step_time_vs_floor"] <= TARGET_VS_FLOOR}
    return {"summary": summary, "floor": floor, "ratios": ratios, "verdict": {subject: verdict}}


# --- driver ----------------------------------------------------------------
def run_benchmark(args, variants, log) -> dict:
    from conformance.worlds.spawned import World

    from benchmarks import throughput_tasks as tasks

    world = World(args.runtime, args.world_size, timeout=args.task_timeout)
    try:
        host = world.run(tasks.host_info)[0]
        if args.impls is None:  # runtime defaults: what the implementation table offers
            names = ["ref", "torch"] if args.runtime == "cpu" else ["ref"]
            if args.runtime != "cpu" and "xla_recipe" in host["impls"]:
                names.append("xla_recipe")
            variants = [parse_variant(n) for n in names]
        labels = [v[0] for v in variants]
        if args.baseline is None:
            args.baseline = "torch" if args.runtime == "cpu" else "xla_recipe"
        log(f"{world.describe()}: torch {host['torch']}"
            + (f", torch_xla {host['torch_xla']}" if "torch_xla" in host else "")
            + f"; variants {labels} + floor")
        pids = [os.getpid()] + world.pids()
        meter = LoadMeter(pids)
        all_v = variants + [(f, f, ()) for f in FLOORS]
        result = {"world_size": args.world_size, "model": args.model, "host": host,
                  "variants": {lab: {"spec": spec, "ddp_kwargs": dict(kw)} for lab, spec, kw in variants},
                  "batches": {}}
        for gb in args.global_batch:
            if gb % args.world_size:
                raise SystemExit(f"error: global batch {gb} does not split over {args.world_size} replicas")
            runs, waits, grad_numel = [], [], None
            for rnd in range(-args.discard, args.runs):
                if args.quiet_below is not None and rnd >= 0:
                    w = wait_quiet(pids, args.quiet_below, args.quiet_timeout)
                    waits.append(w)
                    if not w["quiet"]:
                        log(f"  (others still use {w['cpu_others_cores']} cores; measuring anyway)")
                k = rnd % len(all_v)
                order = all_v[k:] + all_v[:k]  # rotate: every variant leads in turn
                for lab, spec, kw in order:
                    meter.start()
                    res = world.run(tasks.bench_task, variant=spec, model=args.model, global_batch=gb,
                                    warmup=args.warmup, steps=args.steps, lr=args.lr, seed=args.seed,
                                    ddp_kwargs=kw, profile=args.profile and spec not in FLOORS)
                    load = meter.stop()
                    if rnd < 0:
                        continue
                    if any("unsupported" in r for r in res):
                        runs.append({"round": rnd, "variant": lab, "unsupported": res[0].get("unsupported")})
                        continue
                    grad_numel = res[0]["grad_numel"]
                    step_s = max(r["elapsed_s"] for r in res) / args.steps  # the world's pace: slowest replica
                    slowest = max(res, key=lambda r: r["elapsed_s"])
                    row = {"round": rnd, "variant": lab, "step_ms": step_s * 1e3,
                           "examples_per_s_per_replica": res[0]["local_batch"] / step_s,
                           "replica_step_ms": [_r(r["elapsed_s"] / args.steps * 1e3) for r in res],
                           "step_ms_p50_within_run": _r(_med(slowest["step_s"]) * 1e3),
                           "phases_ms": [_r(p * 1e3) for p in slowest["phases_s"]], **load}
                    if "allreduce" in slowest:
                        a = slowest["allreduce"]
                        row["allreduce"] = {"calls_per_step": a["calls_per_step"], "numels": a["numels"],
                                            "ms_per_step": a["seconds_per_step"] * 1e3,
                                            "ms_per_call": [_r(x * 1e3) for x in a["seconds_per_call"]]}
                    if "torch_ddp" in res[0]:
                        row["torch_ddp"] = res[0]["torch_ddp"]
                    row["step_ms"] = _r(row["step_ms"])
                    row["examples_per_s_per_replica"] = _r(row["examples_per_s_per_replica"], 1)
                    runs.append(row)
                    log(f"  batch {gb} round {rnd} {lab:>24}: {row['step_ms']:8.3f} ms/step "
                        f"{row['examples_per_s_per_replica']:9.1f} ex/s/replica "
                        f"(load1 {load['load1']}, others {load['cpu_others_cores']} cores)")
            res = summarise(runs, labels, args.baseline, args.subject)
            res["local_batch"] = gb // args.world_size
            res["grad_numel"] = grad_numel
            res["load"] = {"load1_median": _r(_med([r["load1"] for r in runs if "load1" in r]), 2),
                           "load1_max": max((r["load1"] for r in runs if "load1" in r), default=None),
                           "cpu_others_cores_median": _r(_med([r["cpu_others_cores"] for r in runs
                                                               if "cpu_others_cores" in r]), 2),
                           "cpu_others_cores_max": max((r["cpu_others_cores"] for r in runs
                                                        if "cpu_others_cores" in r), default=None),
                           "quiet_waits_cpu_others_cores": [w["cpu_others_cores"] for w in waits]}
            res["runs"] = runs if args.detail else [{k: r[k] for k in RUN_KEYS if k in r} for r in runs]
            result["batches"][str(gb)] = res
        return result
    finally:
        world.close()


def print_report(runtime, result, out=sys.stdout):
    print(f"\n== {runtime}: world size {result['world_size']}, model {result['model']} ==", file=out)
    for gb, res in result["batches"].items():
        load = res["load"]
        print(f"global batch {gb} (local {res['local_batch']}); load1 median {load['load1_median']} "
              f"(max {load['load1_max']}), other processes' CPU median {load['cpu_others_cores_median']} "
              f"cores (max {load['cpu_others_cores_max']})", file=out)
        print(f"  {'variant':>24} {'runs':>4} {'ms/step':>9} {'[min, max]':>19} {'ex/s/replica':>12}", file=out)
        for lab, row in res["summary"].items():
            print(f"  {lab:>24} {row['runs']:>4} {row['step_ms_median']:9.3f} "
                  f"[{row['step_ms_min']:8.3f}, {row['step_ms_max']:8.3f}] "
                  f"{row['examples_per_s_per_replica_median']:12.1f}", file=out)
        if res["floor"]:
            f = res["floor"]
            print(f"  floor = local {f['local_ms_median']} + all-reduce {f['allreduce_ms_median']} "
                  f"= {f['floor_ms']} ms/step (paired {f['floor_ms_paired_median']})"
                  + (f"; fused in one step {f['fused_ms_median']}" if f.get("fused_ms_median") else ""),
                  file=out)
        for lab, row in res["ratios"].items():
            print(f"  {lab}: " + ", ".join(f"{k} {v}" for k, v in row.items()), file=out)
        for lab, v in res["verdict"].items():
            for k, got in v.items():
                bound = got.get("target_at_least", got.get("target_at_most"))
                print(f"  {lab} {k}: {got['ratio']} (target {'>=' if 'target_at_least' in got else '<='} "
                      f"{bound}): {'MEETS' if got['meets'] else 'MISSES'}", file=out)


def _dumps(doc) -> str:
    """``json.dumps(indent=1)``, but lists of runs one run per line and lists of numbers on one line."""
    held: list[str] = []

    def hold(text):
        held.append(text)
        return f"\0{len(held) - 1}\0"

    def swap(obj, key=None):
        if isinstance(obj, dict):
            return {k: swap(v, k) for k, v in obj.items()}
        if isinstance(obj, list) and obj:
            if key == "runs":
                return hold("[\n" + ",\n".join("  " + json.dumps(r) for r in obj) + "\n ]")
            if not any(isinstance(x, (dict, list)) for x in obj):
                return hold(json.dumps(obj))
            return [swap(x) for x in obj]
        return obj

    text = json.dumps(swap(doc), indent=1)
    return re.sub(r'"\\u0000(\d+)\\u0000"', lambda m: held[int(m.group(1))], text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime", default="cpu", help="cpu (default) or pjrt (needs torch_xla 2.9)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--model", default="mlp", help="a fixtures.models name (default mlp)")
    p.add_argument("--global-batch", default="64", help="comma list, e.g. 24,64,96 (default 64)")
    p.add_argument("--impls", default=None,
                   help="comma list of conformance.impls.builtin specs, each optionally with DDP keywords: "
                        "'ref,torch,torch[bucket_cap_mb=1]' (default: ref,torch on cpu; ref and "
                        "xla_recipe if the table has it on pjrt)")
    p.add_argument("--baseline", default=None,
                   help="variant the throughput ratio divides by (default: torch on cpu, "
                        "xla_recipe on pjrt - upstream's data-parallel path on each runtime)")
    p.add_argument("--subject", default="ref", help="variant the targets are checked for")
    p.add_argument("--runs", type=int, default=7, help="measured rounds (median over them; >= 5)")
    p.add_argument("--discard", type=int, default=1, help="untimed rounds first (imports, compiles)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps at the start of every run")
    p.add_argument("--steps", type=int, default=100, help="timed steps per run")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true",
                   help="count/time the all-reduces each implementation issues (ref: via its collectives)")
    p.add_argument("--quiet-below", type=float, default=None,
                   help="before each round wait until other processes use < this many cores")
    p.add_argument("--quiet-timeout", type=float, default=120.0)
    p.add_argument("--task-timeout", type=float, default=600.0)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--detail", action="store_true",
                   help="keep every run's phases, per-replica times and profile in the JSON")
    args = p.parse_args(argv)
    args.global_batch = [int(b) for b in args.global_batch.split(",") if b.strip()]
    if args.runs < 1 or args.steps < 1:
        p.error("--runs and --steps must be >= 1")
    variants = [parse_variant(v) for v in _split_variants(args.impls)] if args.impls else None
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    result = run_benchmark(args, variants, log)
    result.update({
        "started_utc": started,
        "config": {k: getattr(args, k) for k in ("runs", "discard", "warmup", "steps", "lr", "seed",
                                                 "baseline", "subject", "profile", "quiet_below")},
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "targets": {"throughput_vs_baseline_at_least": TARGET_VS_TORCH,
                    "step_time_vs_floor_at_most": TARGET_VS_FLOOR},
    })
    print_report(args.runtime, result)

    doc = {"schema": 1, "what": "examples/s per replica, interleaved rounds, medians; see "
                                "benchmarks/bench_throughput.py", "runtimes": {}}
    if os.path.exists(args.out):
        try:
            with open(args.out) as f:
                old = json.load(f)
            if old.get("schema") == 1:
                doc["runtimes"].update(old.get("runtimes", {}))
        except (OSError, ValueError):
            pass
    doc["runtimes"][args.runtime] = result
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(_dumps(doc) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
