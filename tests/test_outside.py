"""Meta-test: the kit's main command against DDPs written outside the kit (tests/outside/).

* Each correct DDP: ``python -m conformance run --runtime cpu --ddp <entry> --profile dev``
  (the default command: the whole table, world sizes 2 and 3, the default example budget,
  whatever ``CONFORMANCE_PROFILE`` the suite runs under) exits 0.
* Each faulty DDP: the case that stops it in a default run (``catalog.CAUGHT_BY``, measured with
  ``catch_rate.py --together``) is in the default table at a default world size, and gives a
  fail or vacuous verdict here - so the default main command exits 1 on it. Rerunning only that
  case (through :func:`conformance.evaluate.evaluate`, what every face calls) instead of the
  whole prefix of the table before it costs seconds, not minutes; ``catch_rate.py`` measures the
  full runs. An entry the kit does not catch (catalog column ``main_caught`` False) has no row
  and is reported as such.
"""

import pytest

from conformance.cases.table import CASES, select
from conformance.evaluate import evaluate
from conformance.options import case_world_sizes
from conformance.verdict import BAD
from conformance.worlds.registry import WorldKey
from tests.outside.catalog import CATALOG, CAUGHT_BY
from tests.outside.catch_rate import measure

pytestmark = pytest.mark.cpu

RUN_TIMEOUT_S = 600  # per kit run; a correct run takes ~50-90 s on a loaded 2-core machine
CORRECT = [e for e in CATALOG if not e.faulty]
FAULTY = [e for e in CATALOG if e.faulty]


# CI runs the first control; the others (each the base of a family of faulty entries) are `slow`:
# a default table each, about 2 minutes apiece (tox.ini says how to run them)
CONTROLS = [pytest.param(e, marks=() if i == 0 else pytest.mark.slow, id=e.name) for i, e in enumerate(CORRECT)]


@pytest.mark.long
@pytest.mark.parametrize("entry", CONTROLS)
def test_correct_ddp_passes_the_default_table(entry):
    r = measure(entry, "main", RUN_TIMEOUT_S, ["--profile", "dev"], [])
    assert not r["timed_out"], f"{entry.name}: no verdict within {RUN_TIMEOUT_S} s"
    assert r["exit_code"] == 0, (f"{entry.name}: exit {r['exit_code']}; failing: {r['failing']}; "
                                 f"stderr: {r['stderr_tail']}")


def test_every_faulty_entry_has_its_catching_case():
    caught = {e.name for e in FAULTY if e.main_caught is not False}
    assert set(CAUGHT_BY) == caught, sorted(set(CAUGHT_BY) ^ caught)


@pytest.mark.parametrize("entry", FAULTY, ids=[e.name for e in FAULTY])
def test_faulty_ddp_fails_its_catching_case(entry, conformance_session):
    if entry.main_caught is False:
        pytest.skip(f"the kit does not catch {entry.kind} (catalog main_caught False)")
    cases, w = CAUGHT_BY[entry.name].split("@")
    *before, case = cases.split("+")  # cases run first in the same world, as the default run does
    default = {c.name for c in select([], [])}
    for name in cases.split("+"):
        assert name in default and int(w) in case_world_sizes(CASES[name], "cpu"), (
            f"{name} at W={w} is not part of the default run")
    for name in before:
        evaluate(CASES[name], entry.ddp, "cpu", int(w), conformance_session, shrink=False)
    verdicts = evaluate(CASES[case], entry.ddp, "cpu", int(w), conformance_session, shrink=False)
    bad = [v for v in verdicts if v.status in BAD]
    assert bad, (f"{entry.name} ({entry.kind}) passes {case} at W={w}: "
                 + "; ".join(f"{v.id} {v.status}" for v in verdicts)
                 + "; if the table changed, rerun tests/outside/catch_rate.py --together and "
                 "update catalog.CAUGHT_BY")


def test_raising_ddp_keeps_the_world_and_is_named_in_every_case(conformance_session):
    """A DDP whose replica 1 raises in every forward (issue 26 item 1): each case fails naming
    replica 1, its exception and step, and the next case runs in the same world (the same host
    processes: no new world per failing case)."""
    ddp, pids = "tests.outside.raising_everywhere:Class", None
    for case in ("parity.mlp", "parity.linear", "scenario.core"):
        verdicts = evaluate(CASES[case], ddp, "cpu", 2, conformance_session, shrink=False)
        assert verdicts and all(v.status == "fail" for v in verdicts), [(v.id, v.status) for v in verdicts]
        v = verdicts[0]
        assert "replica 1 raised ValueError: replica 1 refuses to run forward" in v.reason, v.reason
        if case.startswith("parity."):  # a scenario's verdict carries the reason only
            culprits = [d["rank"] for d in v.replicas or [] if d.get("culprit")]
            assert culprits == [1] and (v.replica, v.first_bad_step) == (1, 1), v.reason
        world = conformance_session.pool.get(WorldKey("cpu", 2))
        assert pids is None or world.pids() == pids, f"{case} ran in a new world"
        pids = world.pids()
