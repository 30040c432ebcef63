"""The ``invariant`` kind: invariants every runtime's rank bindings must satisfy across a
world, the replica task that reports them and the check of a world's reports (also
``python -m conformance ranks``, :mod:`conformance.cli.ranks`)."""
from __future__ import annotations

import os

from conformance.cases.kinds import Kind
from conformance.verdict import Verdict


def rank_invariant_violations(bindings: list[dict], expect_world_size: int) -> list[str]:
    """Human-readable violations ([] = ok) of one world's bindings (one dict of RankBindings
    fields per replica, maybe with ``"host"``, the machine: default one host for all). The local
    ordinals of one host are 0..n-1 for its n replicas, as torchrun's LOCAL_RANK and torch_xla's
    ``local_ordinal``."""
    out = []
    w = expect_world_size
    ords = sorted(b["global_ordinal"] for b in bindings)
    if ords != list(range(w)):
        out.append(f"global ordinals {ords} are not 0..{w - 1}")
    for key in ("world_size", "process_count"):
        vals = {b[key] for b in bindings}
        if len(vals) != 1:
            out.append(f"{key} differs across replicas: {sorted(vals)}")
    if {b["world_size"] for b in bindings} != {w}:
        out.append(f"world_size {sorted({b['world_size'] for b in bindings})} != {w}")
    procs: dict[int, list[dict]] = {}
    for b in bindings:
        procs.setdefault(b["process_index"], []).append(b)
    count = bindings[0]["process_count"] if bindings else 0
    if sorted(procs) != list(range(count)):
        out.append(f"process indices {sorted(procs)} are not 0..{count - 1}")
    total = 0
    for p, members in sorted(procs.items()):
        ldc = {m["local_device_count"] for m in members}
        if ldc != {len(members)}:
            out.append(f"process {p}: local_device_count {sorted(ldc)} but {len(members)} replica(s)")
        total += len(members)
    hosts: dict = {}
    for b in bindings:
        hosts.setdefault(b.get("host", 0), []).append(b["local_ordinal"])
    for h, locs in sorted(hosts.items(), key=str):
        if sorted(locs) != list(range(len(locs))):
            out.append(f"host {h}: local ordinals {sorted(locs)} are not 0..{len(locs) - 1}")
    if total != w:
        out.append(f"replicas over all processes {total} != world size {w}")
    return out


def rank_report(ctx) -> dict:
    """World task: this replica's rank bindings, as seen by ``ddp_impl.runtime.ranks`` and
    torch.distributed."""
    import torch.distributed as dist

    from ddp_impl.runtime import ranks
    b = ranks.bindings()
    return {"ctx_rank": ctx.rank, "ctx_world_size": ctx.world_size, "pid": os.getpid(),
            # the machine: the runtime's emulated host (PJRT threads), torchrun's node rank
            # (CPU processes, real or emulated), else one host
            "host": str(ctx.extra.get("host", os.environ.get("GROUP_RANK", "0"))),
            "bindings": {k: getattr(b, k) for k in b.__dataclass_fields__},
            "module_api": {"process_index": ranks.process_index(), "process_count": ranks.process_count(),
                           "global_ordinal": ranks.global_ordinal(), "local_ordinal": ranks.local_ordinal(),
                           "world_size": ranks.world_size(), "local_device_count": ranks.local_device_count()},
            "dist": ({"rank": dist.get_rank(), "world_size": dist.get_world_size()}
                     if dist.is_available() and dist.is_initialized() else None)}


def check_reports(reports: list[dict], world_size: int) -> list[str]:
    """Violations over one world's :func:`rank_report` results (by global ordinal); [] = ok."""
    out = rank_invariant_violations([dict(r["bindings"], host=r["host"]) for r in reports], world_size)
    for ordinal, r in enumerate(reports):
        b = r["bindings"]
        if r["module_api"] != b:
            out.append(f"replica {ordinal}: module functions {r['module_api']} != bindings {b}")
        if b["global_ordinal"] != ordinal or r["ctx_rank"] != ordinal:
            out.append(f"replica {ordinal}: reports global ordinal {b['global_ordinal']}, ctx rank {r['ctx_rank']}")
        if r["dist"] is not None and r["dist"] != {"rank": b["process_index"], "world_size": b["process_count"]}:
            out.append(f"replica {ordinal}: torch.distributed {r['dist']} is not (process_index, process_count) "
                       f"= ({b['process_index']}, {b['process_count']})")
    return out


def evaluate_invariant(case, impl, runtime, w, session, overrides):
    """Verdict of the ``invariant`` row: :func:`rank_report` on every replica, :func:`check_reports`."""
    reports = session.run(runtime, w, rank_report)
    if reports is None:
        return None
    bad = check_reports(reports, w)
    v = Verdict(case.name, "ranks", impl, runtime, case.model, w, "fail" if bad else "pass",
                reason="; ".join(bad)[:300] if bad else f"{w} replica(s) on "
                f"{len({r['host'] for r in reports})} host(s)", diagnosis="\n".join(bad))
    if not bad and w < 2:
        v.status, v.reason = "vacuous", f"world size {w}: nothing to check across replicas"
    return [v]


KIND = Kind("invariant", evaluate_invariant)
