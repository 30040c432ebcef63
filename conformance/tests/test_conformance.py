"""The conformance suite: every case of the table x implementation x runtime x world
size (``pytest --pyargs conformance --conformance-ddp mypkg:MyDDP``), and the kill
matrix: every catalog mutant must fail every case that must kill it."""
import pytest

from conformance.outcome import outcome
from conformance.evaluate import evaluate
from conformance.report.kills import KILLED, SKIP, UNSUPPORTED, KillRow
from conformance.report.expected import mark_expected_failures


def test_case(conformance_case, conformance_session, conformance_log, conformance_expected):
    case, impl, runtime, w = conformance_case
    verdicts = evaluate(case, impl, runtime, w, conformance_session)
    mark_expected_failures(verdicts, conformance_expected)  # warnings: in the session summary
    conformance_log[0].extend(verdicts)  # --conformance-json, summary
    got = outcome(verdicts)
    if got.kind == "fail":
        pytest.fail(got.message, pytrace=False)
    if got.kind == "xfail":
        pytest.xfail(got.message)
    if got.kind == "skip":
        pytest.skip(got.message)


def test_mutant_killed(conformance_kill, conformance_session, conformance_log):
    mutant, case, runtime, w = conformance_kill
    row = KillRow(runtime, w, mutant, case.name, evaluate(case, f"mutant:{mutant}", runtime, w, conformance_session,
                                                              shrink=False))
    conformance_log[1].append(row)
    if row.result in (UNSUPPORTED, SKIP):
        pytest.skip(f"{row.result}: {row.reason()}")
    assert row.result == KILLED, (f"mutant {mutant} survived {case.name}, which must kill it:\n"
                                  + "\n".join(v.summary() for v in row.verdicts))
