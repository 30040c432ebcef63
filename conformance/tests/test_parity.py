"""Parity checks: every (check, model) of the tables x implementation x runtime x world size."""
import pytest

from conformance.checks import CHECKS
from conformance.runner import checks_for
from fixtures.models import PARITY_MODELS

CASES = [pytest.param(c, m, id=f"{c}-{m}") for m in PARITY_MODELS for c in checks_for(m)]


def report(verdict):
    """Map a verdict to the pytest outcome: only ``pass`` passes."""
    if verdict.status == "pass":
        return
    if verdict.status in ("unsupported", "skip"):
        pytest.skip(f"{verdict.status}: {verdict.reason}")
    pytest.fail(verdict.summary(), pytrace=False)


@pytest.mark.parametrize("check,model", CASES)
def test_check(check, model, runtime_world, impl, world, runner, verdict_log):
    runtime, w = runtime_world
    verdict = runner.verdicts(runtime, w, impl, model)[check]
    verdict_log.append(verdict)  # --conformance-json
    assert verdict.check in CHECKS
    report(verdict)
