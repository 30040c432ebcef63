"""A failing verdict's figures are its check's own (issue 29 item 3): for one failing
(mutant, case) pair per family, the deviation, bound, margin and replica fields agree with
each other and with what the reason says."""
import math
import re

import pytest

from conformance.cases.table import CASES
from conformance.evaluate import evaluate

pytestmark = pytest.mark.cpu

#: (mutant, case it must kill), one or more per family; properties shrink (the verdict must
#: carry the minimal counterexample's numbers, not the worst example's seen while shrinking).
PAIRS = [("no_initial_broadcast", "property.broadcast"), ("sum_not_mean", "property.allreduce_mean"),
         ("clip_local_grad", "property.scale_linearity"), ("no_grad_sync", "parity.linear"),
         ("buffers_not_broadcast", "feature.broadcast_buffers_on"), ("batch_weighted", "scenario.core")]

_NUM = r"([0-9.]+(?:e[-+]?\d+)?)"


def figure_problems(v) -> list[str]:
    """What disagrees in one failing verdict (empty: consistent)."""
    out = []
    dev, bound, margin = v.max_dev, v.atol, v.margin
    if not math.isnan(dev):
        if math.isnan(bound):
            out.append(f"max_dev {dev} without a bound")
        elif not dev > bound:
            out.append(f"failing with max_dev {dev} <= bound {bound}")
        want = bound / dev if dev else math.inf
        if not (math.isclose(margin, want, rel_tol=1e-6) or margin == want):
            out.append(f"margin {margin} != bound / max_dev = {want}")
        if not margin < 1:
            out.append(f"failing with margin {margin} >= 1")
    said = re.search(r"\|(?:dev|error)\| " + _NUM, v.reason)  # properties name the failing element
    if said and not math.isclose(float(said.group(1)), dev, rel_tol=1e-3):
        out.append(f"reason says |dev| {said.group(1)}, max_dev is {dev}")
    who = re.search(r"\breplica (\d+)\b(?!,)", v.reason)
    if who and v.replica is not None and int(who.group(1)) != v.replica:
        out.append(f"reason names replica {who.group(1)}, field replica is {v.replica}")
    if v.family == "property" and math.isnan(dev):
        out.append("a property's failed comparison left max_dev empty")
    return out


@pytest.mark.parametrize("mutant,case", PAIRS, ids=[f"{m}-{c}" for m, c in PAIRS])
def test_failing_verdict_figures_agree_with_its_reason(mutant, case, conformance_session):
    got = evaluate(CASES[case], f"mutant:{mutant}", "cpu", 2, conformance_session,
                   shrink=case.startswith("property."))
    bad = [v for v in got if v.status == "fail"]
    assert bad, [(v.check, v.status, v.reason[:200]) for v in got]  # the mutant is caught
    problems = {v.check: figure_problems(v) for v in bad}
    assert not any(problems.values()), (problems, [v.reason[:300] for v in bad])


def test_the_checker_catches_disagreeing_figures():
    from conformance.verdict import Verdict
    v = Verdict("property.x", "property", "m", "cpu", "-", 2, "fail", max_dev=0.0, atol=1e-5, margin=math.inf,
                reason="replica 1 ...: |dev| 1.65769 > 1e-05", replica=0, family="property")
    got = " ".join(figure_problems(v))
    assert "<= bound" in got and "margin" in got and "reason says |dev| 1.65769" in got and "replica 1" in got
