"""Invariants every runtime's rank bindings must satisfy across a world."""
from __future__ import annotations


def rank_invariant_violations(bindings: list[dict], expect_world_size: int) -> list[str]:
    """Check one world's bindings (one dict of RankBindings fields per replica).

    Each dict may carry ``"host"`` (the machine; default one host for all).
    Invariants: global ordinals are exactly 0..W-1; world size and process count
    agree on every replica; process indices are exactly 0..P-1; each process's
    local device count equals its number of replicas and they sum to W; the
    local ordinals of one host are exactly 0..n-1 for its n replicas (as
    torchrun's LOCAL_RANK and torch_xla's ``local_ordinal``). Returns
    human-readable violations ([] = ok).
    """
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
