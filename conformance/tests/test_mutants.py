"""Mutant self-test: every mutant is caught by at least one check (a real
failure, not vacuity), and by the checks its catalog row names."""
import pytest

from conformance.mutants import MUTANTS, PARITY_MUTANTS


@pytest.mark.parametrize("mutant", PARITY_MUTANTS)
def test_mutant_killed(mutant, runtime_world, world, runner, kill_log):
    from conformance.selftest import mutant_verdicts
    runtime, w = runtime_world
    verdicts = mutant_verdicts(runner, runtime, w, mutant)
    kill_log.append((runtime, w, mutant, verdicts))
    killers = {v.check for v in verdicts if v.status == "fail"}
    assert killers, f"mutant {mutant} survived every check:\n" + "\n".join(v.summary() for v in verdicts)
    missing = set(MUTANTS[mutant].killed_by) - killers
    assert not missing, f"mutant {mutant} not caught by its documented check(s) {sorted(missing)}"
