"""The kill matrix: every catalog mutant through every case that must kill it."""
from __future__ import annotations

from conformance.report.text import KillRow


def kill_rows(runtime: str, world_size: int, session=None, mutants=None, cases=None, progress=None) -> list[KillRow]:
    """``KillRow`` per (mutant, case whose ``must_kill`` names it) on one runtime and world size.

    ``mutants`` / ``cases`` restrict the matrix (default: the whole catalog and table). A
    failing property or scenario search is not shrunk: a kill needs one failing example.
    """
    from conformance.cases.table import CASES
    from conformance.evaluate import evaluate
    from conformance.impls.mutants.catalog import MUTANTS
    allowed = None if cases is None else {c.name for c in cases}
    rows = []
    for m in mutants or list(MUTANTS):
        for case in CASES.values():
            if m in case.must_kill and (allowed is None or case.name in allowed):
                rows.append(KillRow(runtime, world_size, m, case.name,
                                    evaluate(case, f"mutant:{m}", runtime, world_size, session,
                                             shrink=False)))
                if progress:
                    progress()
    return rows
