"""Rank bindings of a live world, checked: ``python -m conformance ranks`` and the ``invariant.ranks`` case.

Every replica reports its bindings (:func:`conformance.cases.invariant.kind.rank_report`:
``ddp_impl.runtime.ranks``'s snapshot and module functions, torch.distributed's rank,
and ``host`` = torchrun's ``GROUP_RANK``, the machine) and the world must satisfy
:func:`conformance.cases.invariant.kind.rank_invariant_violations` - global ordinals
0..W-1, process indices 0..P-1, local ordinals 0..n-1 on every host - plus
the consistency checks of ``check_reports``. Under ``torchrun --nnodes=2 --nproc-per-node=2``
that is 4 replicas, process indices 0..3, local ordinals 0..1 on each of two hosts.
"""
from __future__ import annotations

from conformance.cases.invariant.kind import check_reports, rank_report
from conformance.cli.output import stdout_for_json
from conformance.report.text import document, write_json_doc
from conformance.options import parse_ranks_world
from conformance.worlds.launched import ExternalPool, root_decides
from conformance.worlds.runtimes import WorldKey


def rank_check(world) -> dict | None:
    """Run :func:`rank_report` on every replica of ``world`` and check the invariants.

    Returns ``{"runtime", "world_size", "hosts", "reports", "violations"}``, or
    ``None`` on a non-root process of an externally launched world.
    """
    reports = world.run(rank_report)
    if reports is None:
        return None
    return {"runtime": world.runtime, "world_size": world.world_size,
            "hosts": sorted({r["host"] for r in reports}, key=str),
            "reports": reports, "violations": check_reports(reports, world.world_size)}


def rank_table(check: dict) -> str:
    """One line per replica: its bindings and host."""
    keys = ("global_ordinal", "process_index", "process_count", "local_ordinal",
            "local_device_count", "world_size")
    head = ("host",) + keys + ("pid",)
    rows = [head] + [(str(r["host"]),) + tuple(str(r["bindings"][k]) for k in keys) + (str(r["pid"]),)
                     for r in check["reports"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def summary(check: dict) -> str:
    v = check["violations"]
    head = (f"rank invariants ({check['runtime']}, world size {check['world_size']}, "
            f"{len(check['hosts'])} host(s)): ")
    return head + ("ok" if not v else f"{len(v)} violation(s)\n  " + "\n  ".join(v))


def command(settings, *, runtime: str, world_size: str | None, launcher: str, json: str | None) -> int:
    """``python -m conformance ranks``: print every replica's bindings; exit 1 on a violation."""
    size = parse_ranks_world(runtime, world_size, launcher)
    if launcher == "env":
        pool = ExternalPool(runtime, settings)
    else:
        from conformance.worlds.pool import WorldPool
        pool = WorldPool(settings)
    try:
        check = rank_check(pool.get(WorldKey(runtime, size)))

        def report():  # on the root only (the process that has every replica's report)
            with stdout_for_json(json) as json_out:  # --json -: the JSON on stdout, the table on stderr
                print(rank_table(check))
                print(summary(check))
                if json:
                    write_json_doc(json_out or json, document("ranks", ranks=[check]))
                    print(f"JSON report: {'stdout' if json_out else json}")
            return 1 if check["violations"] else 0
        return root_decides(pool, report)
    finally:
        pool.close()
