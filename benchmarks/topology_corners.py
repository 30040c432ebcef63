#!/usr/bin/env python
"""Which topologies draw each corner: the first N module graphs ``scenario.topology``'s generator
draws (derandomized, as a run draws them), per corner the number of topologies holding it, of
distinct graph shapes (ops and edges) among them, and the layers it sat on::

    python benchmarks/topology_corners.py [--n 200] [--out benchmarks/results/topology-corners.json]

A script, not a test; docs/topologies.md quotes its table. Exit 2 on bad input (one ``error:`` line).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conformance.cases.scenario.topology import corners, topologies  # noqa: E402

#: Corner phrase prefixes and the node key whose value names the layer it sat on.
NODE_CORNERS = {"float64 layer": ("dtype", "float64"), "bfloat16 layer": ("dtype", "bfloat16"),
                "complex64 layer": ("dtype", "complex64"), "transposed weight": ("layout", "transposed"),
                "channels_last weight": ("layout", "channels_last"), "sparse gradient": ("sparse", True),
                "applied twice": ("apply", "twice"),
                "applied checkpoint nonreentrant": ("apply", "checkpoint_nonreentrant"),
                "applied checkpoint reentrant": ("apply", "checkpoint_reentrant"),
                "frozen layer": ("frozen", True), "gated node": ("gate", "*"), "tied weight": ("tie", "*"),
                "module reused": ("reuse", "*")}


def draw(n: int) -> list[dict]:
    from hypothesis import HealthCheck, given, settings
    out = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(t=topologies())
    def collect(t):
        out.append(t)
    collect()
    return out[:n]


def shape(t: dict) -> str:
    return ";".join(f"{nd['op']}<{','.join(map(str, nd['src']))}" for nd in t["nodes"]) + f">{t['outputs']}"


def table(ts: list[dict]) -> dict:
    rows = collections.defaultdict(lambda: {"topologies": 0, "shapes": set(), "layers": collections.Counter()})
    for t in ts:
        for c in corners(t):
            row = rows[c]
            row["topologies"] += 1
            row["shapes"].add(shape(t))
            key = next((v for p, v in NODE_CORNERS.items() if c.startswith(p)), None)
            for nd in t["nodes"]:
                if key and ((key[1] == "*" and nd[key[0]] is not None) or nd[key[0]] == key[1]):
                    row["layers"][nd["op"]] += 1
    return {c: {"topologies": r["topologies"], "distinct_shapes": len(r["shapes"]),
                "layers": dict(r["layers"].most_common())} for c, r in sorted(rows.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=200, help="topologies drawn (default 200)")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "topology-corners.json"))
    args = p.parse_args(argv)
    if not 1 <= args.n <= 100_000:
        print(f"error: --n {args.n}: 1..100000 topologies", file=sys.stderr)
        return 2
    ts = draw(args.n)
    doc = {"drawn": len(ts), "distinct_shapes": len({shape(t) for t in ts}), "corners": table(ts)}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for c, r in doc["corners"].items():
        print(f"| {c} | {r['topologies']} | {r['distinct_shapes']} | {', '.join(r['layers']) or '-'} |")
    print(f"{doc['drawn']} drawn, {doc['distinct_shapes']} distinct shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
