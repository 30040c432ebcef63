"""Feature checks (conformance.features): every documented DDP behaviour, per
implementation x runtime, and the mutants that prove each check can fail."""
import pytest

from conformance.features import FEATURES
from conformance.tests.test_parity import report


@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature(feature, runtime_world, impl, world, runner, verdict_log):
    runtime, w = runtime_world
    verdicts = runner.feature_verdicts(runtime, w, impl, feature)
    verdict_log.extend(verdicts)  # --conformance-json
    assert verdicts, "a feature must produce at least one verdict"
    bad = [v for v in verdicts if v.status in ("fail", "vacuous")]
    if bad:
        pytest.fail("\n".join(v.summary() for v in bad), pytrace=False)
    for v in verdicts:
        report(v)


MUTANT_CASES = [pytest.param(f, m, id=f"{f}-{m}") for f, row in FEATURES.items() for m in row.mutants]


@pytest.mark.parametrize("feature,mutant", MUTANT_CASES)
def test_feature_mutant_killed(feature, mutant, runtime_world, world, runner, kill_log):
    runtime, w = runtime_world
    verdicts = runner.feature_verdicts(runtime, w, f"mutant:{mutant}", feature)
    kill_log.append((runtime, w, f"{mutant} ({feature})", verdicts))
    if all(v.status in ("unsupported", "skip") for v in verdicts):
        pytest.skip(f"unsupported: {verdicts[0].reason}")
    assert any(v.status == "fail" for v in verdicts), (
        f"mutant {mutant} survived feature {feature}:\n" + "\n".join(v.summary() for v in verdicts))
