"""Leak probe: many training runs in one world; what each replica host keeps, per probe.

    python benchmarks/leak_probe.py --ddp ref,torch --runs 300 --every 50 --out benchmarks/results/leak-cpu.json

For each implementation, one CPU world of ``--world-size`` replicas runs
:func:`conformance.cases.shared.loop.train_replica` ``--runs`` times (the tolerance table's
run of ``--model``, seed + k; a zoo or user model: its own run), as ``run --repeat`` does. After the first run and
every ``--every`` runs, each host reports, after ``gc.collect()``: VmRSS, glibc's
heap (``mallinfo2``: bytes in use, free, arena), the number of gc-tracked objects
and the types whose count changed since the previous probe. Python objects that
grow mean a leak in Python (kit, DDP); bytes in use that grow with flat object
counts mean one in C/C++ (torch, gloo); RSS that grows while bytes in use stay
flat is the allocator (``--trim`` runs ``malloc_trim(0)`` after each probe and
records the RSS after it). Writes JSON; prints one line per probe of host 0.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conformance.cases.shared.loop import RunSpec, train_replica  # noqa: E402
from conformance.cases.shared.measured import user_run  # noqa: E402
from fixtures.models import MODELS  # noqa: E402
from conformance.worlds.procmem import rss_mib  # noqa: E402
from conformance.worlds.spawned import World  # noqa: E402

_MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
              "fordblks", "keepcost")
_last_types: dict = {}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in _MALLINFO2]


def _heap(libc) -> dict:
    m = libc.mallinfo2()
    return {"in_use_kib": m.uordblks // 1024, "free_kib": m.fordblks // 1024, "arena_kib": m.arena // 1024}


def probe(ctx, trim=False) -> dict:
    """World task: this host's memory after ``gc.collect()`` (see the module docstring)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    changed = {k: types[k] - _last_types.get(k, 0) for k in set(types) | set(_last_types)
               if types[k] != _last_types.get(k, 0)} if _last_types else {}
    _last_types.clear()
    _last_types.update(types)
    out = {"rank": ctx.rank, "rss_mib": rss_mib(os.getpid()), "heap": _heap(libc),
           "gc_objects": sum(types.values()),
           "types_changed": dict(sorted(changed.items(), key=lambda kv: -abs(kv[1]))[:20])}
    if trim:
        libc.malloc_trim(0)
        out["rss_after_trim_mib"] = rss_mib(os.getpid())
    return out


def _spec(impl, model, **overrides) -> RunSpec:
    """The run of ``model``: the tolerance table's for a kit model, the model's own for a user or
    zoo model (``package.module:factory``, ``zoo:NAME``)."""
    if MODELS[model].user is not None:
        return user_run(impl, model, **overrides)
    return RunSpec.from_table("cpu", impl, model, **overrides)


def sweep(impl, args) -> list[dict]:
    rows = []
    world = World("cpu", args.world_size)
    try:
        rows.append({"runs": 0, "hosts": world.run(probe)})
        seed = _spec(impl, args.model).seed
        for k in range(args.runs):
            spec = _spec(impl, args.model, seed=seed + k)
            world.run(train_replica, spec=spec.as_dict())
            if k == 0 or (k + 1) % args.every == 0:
                rows.append({"runs": k + 1, "hosts": world.run(probe, trim=args.trim)})
                h = rows[-1]["hosts"][0]
                print(f"{impl} after {k + 1}: rss {h['rss_mib']} MiB, heap in use {h['heap']['in_use_kib']} KiB "
                      f"(free {h['heap']['free_kib']}), {h['gc_objects']} objects, changed "
                      f"{dict(list(h['types_changed'].items())[:6])}", flush=True)
    finally:
        world.close()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ddp", default="ref,torch", help="implementations, comma-separated")
    ap.add_argument("--model", default="linear")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--trim", action="store_true", help="malloc_trim(0) after each probe")
    ap.add_argument("--out", default="leak-cpu.json")
    args = ap.parse_args()
    doc = {"kind": "leak_probe", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model": args.model, "world_size": args.world_size, "runs": args.runs, "trim": args.trim,
           "sweeps": {impl: sweep(impl, args) for impl in args.ddp.split(",")}}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
