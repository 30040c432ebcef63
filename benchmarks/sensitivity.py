"""Sensitivity of the default run: the smallest relative gradient perturbation it catches.

A DDP that is correct except that its synced gradient is multiplied by (1 + eps) -
on one replica (``--mode one``: replica 1 only) or on every replica (``--mode all``)
- is run through the main command (``python -m conformance run``) for a descending
ladder of eps; the figure is the smallest eps whose run exits 1. Writes JSON.

    python benchmarks/sensitivity.py --out benchmarks/results/sensitivity.json [--only parity,scenario]

The perturbed DDP is ``conformance.impls.mutants.scratch.ScratchDDP`` with a scaled
reduction (``benchmarks.sensitivity:PerturbedDDP``), eps and mode passed through
the environment (replicas inherit it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from conformance.impls.mutants.scratch import ScratchDDP

LADDER = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7)


class PerturbedDDP(ScratchDDP):
    """ScratchDDP whose synced gradient is scaled by 1 + $SENS_EPS on replica 1
    ($SENS_MODE=one) or on every replica ($SENS_MODE=all)."""

    def _reduce(self, flat):
        out = super()._reduce(flat)
        eps = float(os.environ.get("SENS_EPS", "0"))
        if os.environ.get("SENS_MODE", "all") == "all" or self.rank == 1:
            out = out * (1 + eps)
        return out


def run(eps: float, mode: str, only: str, timeout: float) -> dict:
    env = dict(os.environ, SENS_EPS=repr(eps), SENS_MODE=mode)
    t0 = time.monotonic()
    args = [sys.executable, "-m", "conformance", "run", "--runtime", "cpu", "--ddp",
            "benchmarks.sensitivity:PerturbedDDP", "--quiet", "--json", os.devnull]
    if only:
        args += ["--only", only]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    failing = [ln for ln in r.stdout.splitlines() if " fail " in ln]
    return {"eps": eps, "mode": mode, "exit": r.returncode, "caught": r.returncode == 1,
            "failing_verdicts": len(failing), "first_failing": failing[0][:200] if failing else None,
            "wall_s": round(time.monotonic() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/sensitivity.json")
    p.add_argument("--only", default="", help="--only tags passed to the run (default: the whole table)")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    rows = []
    figure = {}
    for mode in ("one", "all"):
        smallest = None
        for eps in LADDER:
            row = run(eps, mode, args.only, args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not row["caught"]:
                break
            smallest = eps
        figure[mode] = smallest
    doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ladder": LADDER,
           "only": args.only or "(whole table)", "smallest_caught": figure, "runs": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"smallest eps caught: one replica {figure['one']}, all replicas {figure['all']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
