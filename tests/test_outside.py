"""Meta-test: the kit's main command against DDPs written outside the kit (tests/outside/).

For each catalog entry: ``python -m conformance run --runtime cpu --ddp <entry> --json <tmp>``
must exit 0 for the correct DDP (the whole table) and 1 for every faulty one (with
``--exitfirst``: the verdict is the same, the run stops at the first failure). Entries the current kit does not
catch (catalog column ``main_caught`` False) are ``xfail(strict=True)``: when the kit learns to
catch one, the strict xfail turns into a failure, and the integrator flips the column.
Each run is bounded by ``RUN_TIMEOUT_S`` (the process group is killed on expiry).
"""

import pytest

from tests.outside.catalog import CATALOG
from tests.outside.catch_rate import measure

RUN_TIMEOUT_S = 600  # per kit run; a correct run takes ~50 s on a loaded 2-core machine


def _param(entry):
    marks = [pytest.mark.cpu]
    if entry.faulty and entry.main_caught is False:
        marks.append(pytest.mark.xfail(strict=True,
                                       reason=f"kit misses {entry.kind} (issue 11)"))
    return pytest.param(entry, id=entry.name, marks=marks)


@pytest.mark.parametrize("entry", [_param(e) for e in CATALOG])
def test_main_command_verdict(entry):
    r = measure(entry, "main", RUN_TIMEOUT_S, ["--exitfirst"] if entry.faulty else [], [])
    assert not r["timed_out"], f"{entry.name}: no verdict within {RUN_TIMEOUT_S} s"
    want = 1 if entry.faulty else 0
    assert r["exit_code"] == want, (
        f"{entry.name} ({entry.kind or 'correct'}): exit {r['exit_code']}, want {want}; "
        f"failing: {r['failing']}; stderr: {r['stderr_tail']}")
