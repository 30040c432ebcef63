"""``python -m conformance ranks``: every replica of a live world reports its rank bindings
(:func:`conformance.cases.invariant.kind.rank_report`, as the ``invariant.ranks`` case does) and
the world must pass :func:`~conformance.cases.invariant.kind.check_reports` (the invariants of
``rank_invariant_violations`` - global ordinals 0..W-1, process indices 0..P-1, local ordinals
0..n-1 on every host - and consistency checks). Under ``torchrun --nnodes=2 --nproc-per-node=2``
that is 4 replicas, process indices 0..3, local ordinals 0..1 on each of two hosts.
"""
from __future__ import annotations

from conformance.cases.invariant.kind import check_reports, rank_report
from conformance.cli.output import stdout_for_json
from conformance.report.text import document, text_table, write_json_doc
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
    """One line per replica: its host, bindings and pid."""
    keys = ("global_ordinal", "process_index", "process_count", "local_ordinal",
            "local_device_count", "world_size")
    return text_table([{"host": str(r["host"]), **{k: str(r["bindings"][k]) for k in keys}, "pid": str(r["pid"])}
                       for r in check["reports"]])


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
