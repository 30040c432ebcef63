"""The shipped rows' own runs are clean: every verdict a shipped row fails is explained by a
finding the kit ships (conformance/report/findings/), and CI runs every shipped row through the
main command - which exits 1 on a failure no finding explains - at a world size that is not a
power of two (faults that cancel at W=2 and 4 show at 3: finding 20 did)."""
import configparser
import json
import pathlib
import re

import pytest

from conformance.impls.builtin import ROWS, impls
from conformance.report.findings import FILES
from conformance.verdict import Verdict

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The failing and xfail verdict ids of a recorded ``--ddp all`` run (before findings applied).
RECORDED = {"pjrt": ROOT / "tests" / "data" / "shipped-rows-pjrt.json"}


def unexplained(ids, runtime: str) -> list[str]:
    """The verdict ids of shipped rows that fail and that no shipped finding of ``runtime`` lists."""
    from conformance.report.expected import ExpectedFailures
    kit = sum((f.entries() for f in FILES if f.name.startswith(runtime + "-")), ExpectedFailures())
    out = []
    for vid in ids:
        impl = re.search(r"\[(.+)-[a-z0-9_]+-w\d+\]$", vid)[1]
        if impl in ROWS and vid not in kit:
            out.append(vid)
    return out


def test_every_recorded_failure_of_a_shipped_row_is_a_finding():
    for runtime, path in RECORDED.items():
        rec = json.loads(path.read_text())
        assert rec["failing"], f"{path.name} records no failing verdict: rerun `{rec['command']}`"
        assert unexplained(rec["failing"], runtime) == [], f"{rec['command']}: failing verdicts no finding explains"


def test_the_check_finds_an_unexplained_failure():
    ok = "parity.float64:param_parity[xla_recipe-pjrt-w3]"
    new = Verdict("parity.linear", "param_parity", "xla_recipe", "pjrt", "linear", 5, "fail").id
    mine = Verdict("parity.linear", "param_parity", "mypkg:MyDDP", "pjrt", "linear", 2, "fail").id
    assert unexplained([ok, new, mine], "pjrt") == [new]


def _main_runs(env: str) -> list[tuple[set, set]]:
    """``[(rows, world sizes)]`` of each ``python -m conformance run`` command of tox env ``env``
    (``--ddp all``: every row that runs on the env's runtime)."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    commands = tox[f"testenv:{env}"]["commands"]
    assert "expected-failures" not in commands and "strict-findings" not in commands
    out = []
    for line in commands.splitlines():
        if "-m conformance run" not in line:
            continue
        runtime = re.search(r"--runtime (\w+)", line)[1]
        names = set(re.search(r"--ddp (\S+)", line)[1].split(","))
        if "all" in names:
            names |= {n for n, row in impls().items() if runtime not in row.unsupported}
        out.append((names - {"all"}, {int(w) for w in re.search(r"--world-size (\S+)", line)[1].split(",")}))
    return out


@pytest.mark.parametrize("env, runtime", [("cpu", "cpu"), ("pjrt", "pjrt")])
def test_ci_runs_every_shipped_row_through_the_main_command_at_a_non_power_of_two(env, runtime):
    rows = {n for n, row in impls().items() if runtime not in row.unsupported}
    runs = _main_runs(env)
    ran = set().union(*(names for names, _ in runs))
    assert rows <= ran, f"tox -e {env} never runs {sorted(rows - ran)} through the main command"
    odd = set().union(*(names for names, ws in runs if any(w & (w - 1) for w in ws)))
    assert rows <= odd, f"tox -e {env} runs {sorted(rows - odd)} only at powers of two"
