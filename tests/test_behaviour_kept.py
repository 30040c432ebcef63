"""The package moved into sub-packages without changing what it checks: the case table's
verdict ids and the kill matrix's (mutant, case) pairs are the ones recorded before the
move (tests/data, from commit ef9ffe7), and so is the outside catalog (its entries, their measured
outcomes and the case that catches each). A change to the table that is meant shows here:
update the recorded file in the same commit and say why."""
import os

from conformance.cases import CASES
from conformance.impls.mutants.catalog import MUTANTS
from tests.outside.catalog import CATALOG, CAUGHT_BY

DATA = os.path.join(os.path.dirname(__file__), "data")


def _recorded(name):
    with open(os.path.join(DATA, name)) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def test_the_case_table_gives_the_recorded_verdict_ids():
    ids = sorted(f"{c.name}:{check}[{impl}-cpu-w{w}]" for impl in ("torch", "ref") for w in (2, 3)
                 for c in CASES.values() for check in c.checks)
    recorded = _recorded("verdict-ids-cpu-torch-ref.txt")
    assert ids == recorded, (f"new: {sorted(set(ids) - set(recorded))[:10]}; "
                             f"gone: {sorted(set(recorded) - set(ids))[:10]}")


def test_the_kill_matrix_has_the_recorded_pairs():
    pairs = sorted(f"{m} {c.name}" for c in CASES.values() for m in c.must_kill)
    assert pairs == sorted(_recorded("kill-pairs.txt"))
    assert {p.split()[0] for p in pairs} == set(MUTANTS)


def test_the_outside_catalog_is_the_recorded_one():
    rows = [f"{e.name} {e.spec} {e.main_caught} {e.pytest_caught} {CAUGHT_BY.get(e.name, '-')}" for e in CATALOG]
    recorded = _recorded("outside-catalog.txt")
    assert rows == recorded, (f"new: {sorted(set(rows) - set(recorded))[:5]}; "
                              f"gone: {sorted(set(recorded) - set(rows))[:5]}")
