"""docs/keyword-protocol.md holds: a keyword is refused by a ``TypeError`` naming it, acceptance
is judged per value, and the page's lists are the code's (from-scratch DDPs in tests/outside/)."""
import pathlib
import re

import pytest

from conformance.cases.shared.step import PERFORMANCE_HINTS
from conformance.cases.table import CASES
from conformance.impls.row import DDP_KEYWORDS

PAGE = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "keyword-protocol.md").read_text()
OUTSIDE = "tests.outside.keyword_refusals"


def test_the_page_names_existing_cases_keywords_and_hints():
    table = PAGE.split("| cases | keywords passed |", 1)[1].split("\n\n", 1)[0]
    cases = set(re.findall(r"`((?:parity|feature|scenario|property)\.[\w*]+)`", table))
    assert cases and all(c.endswith("*") or c in CASES for c in cases), sorted(c for c in cases if c not in CASES)
    words = set(re.findall(r"`(\w+)`", table))
    named = {w for w in words if w in DDP_KEYWORDS}
    assert named >= {"broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "static_graph",
                     "process_group", "init_sync"}, named
    hints = re.search(r"\*\*Performance hints\*\* \(([^)]*)", PAGE)[1]
    assert set(re.findall(r"`(\w+)`", hints)) & set(DDP_KEYWORDS) == set(PERFORMANCE_HINTS)


@pytest.mark.cpu
def test_acceptance_is_judged_per_value(conformance_session):
    from conformance.evaluate import evaluate
    ddp = f"{OUTSIDE}:RefusesUnbroadcastBuffers"
    off = evaluate(CASES["feature.broadcast_buffers_off"], ddp, "cpu", 2, conformance_session, shrink=False)
    assert off and {v.status for v in off} == {"unsupported"}, [(v.check, v.status, v.reason) for v in off]
    assert "refuses keyword broadcast_buffers" in off[0].reason, off[0].reason
    on = evaluate(CASES["feature.broadcast_buffers_on"], ddp, "cpu", 2, conformance_session, shrink=False)
    assert on and {v.status for v in on} == {"pass"}, [(v.check, v.status, v.reason) for v in on]


@pytest.mark.cpu
def test_a_type_error_that_names_no_keyword_is_a_crash_not_a_refusal(conformance_session):
    from conformance.evaluate import evaluate
    got = evaluate(CASES["feature.broadcast_buffers_off"], f"{OUTSIDE}:RefusesWithoutNaming", "cpu", 2,
                   conformance_session, shrink=False)
    assert got and {v.status for v in got} == {"fail"}, [(v.check, v.status, v.reason) for v in got]
    assert "this option is not implemented" in got[0].reason, got[0].reason
