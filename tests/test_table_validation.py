"""The case table checks itself: bad rows fed to the validator (conformance.cases.validation.validate)
are refused with an error naming the row (and the mutant, for a mutant the row cannot kill)."""
from dataclasses import replace

import pytest

from conformance.cases.row import Case
from conformance.cases.validation import validate
from conformance.cases.table import CASES
from conformance.impls.mutants.catalog import MUTANTS


def rows(**changes):
    """The table's rows with row ``name`` changed by ``changes[name]`` (a dict of fields)."""
    return [replace(c, **changes.get(c.name, {})) for c in CASES.values()]


def refused(rows, *needles, mutants=None):
    with pytest.raises(ValueError) as err:
        validate(rows, mutants)
    for n in needles:
        assert n in str(err.value), str(err.value)
    return str(err.value)


def mutants(**changes):
    """The catalog with mutant ``name`` changed by ``changes[name]``."""
    return {n: replace(m, **changes.get(n, {})) for n, m in MUTANTS.items()}


def test_the_table_validates_as_built():
    again = validate(list(CASES.values()))
    assert list(again) == list(CASES)
    assert [c.checks for c in again.values()] == [c.checks for c in CASES.values()]


def test_duplicate_name():
    refused(rows() + [CASES["parity.mlp"]], "row 'parity.mlp'", "duplicate name")


@pytest.mark.parametrize("field, value, needle", [
    ("family", "parity", "family 'parity'"),
    ("kind", "fancy", "unknown kind 'fancy'"),
    ("model", "resnet", "unknown model 'resnet'"),
    ("tolerance", "float8", "unknown tolerance key 'float8'"),
    ("must_kill", ("no_such_mutant",), "unknown mutant(s) ['no_such_mutant']"),
    ("train", {"setups": ("no_such_setup",)}, "unknown setup(s) ['no_such_setup']"),
])
def test_unknown_names(field, value, needle):
    refused(rows(**{"feature.comm_hook": {field: value}}), "row 'feature.comm_hook'", needle)


def test_a_task_row_needs_task_and_judge():
    refused(rows(**{"feature.no_sync": {"judge": None}}), "row 'feature.no_sync'", "task and judge")


def test_property_names_come_from_the_property_kind():
    refused(rows(**{"property.broadcast": {"prop": "brodcast"}}), "row 'property.broadcast'",
            "unknown property 'brodcast'", "allreduce_mean")


@pytest.mark.parametrize("space, needle", [
    ({"ddp_extras": ("buckets",)}, "unknown key(s) ['ddp_extras']"),
    ({"ddp_extra": ("bucket",)}, "unknown ddp_extra ['bucket']"),
    ({"optimizers": ("sgd", "lamb")}, "optimizers ('sgd', 'lamb')"),
    ({"optimizers": ()}, "optimizers ()"),
    ({"max_steps": 8}, "max_steps 8"),
    ({"budget": 0}, "budget 0"),
])
def test_scenario_spaces(space, needle):
    refused(rows(**{"scenario.buckets": {"args": {"space": space}}}), "row 'scenario.buckets'",
            "scenario space", needle)


def test_a_mutant_that_ignores_a_keyword_the_row_requires_could_never_be_killed():
    # the reference DDP (and its mutants) accept mixed_precision and ignore it
    refused(rows(**{"parity.linear": {"train": {"requires": ("mixed_precision",)}}}),
            "row 'parity.linear'", "mutant 'no_grad_sync'", "ignores keyword(s) ['mixed_precision']")


def test_a_mutant_without_a_method_the_row_requires_could_never_be_killed():
    # the reference DDP (and its mutants) has no join()
    refused(rows(**{"parity.linear": {"train": {"requires": ("join",)}}}),
            "row 'parity.linear'", "mutant 'no_grad_sync'", "has no join()")


def test_every_mutant_is_killed_by_some_row():
    refused(rows(**{"feature.tied_weights": {"must_kill": ()}}), "unties_shared_weights", "killed by no case")


@pytest.mark.parametrize("mutant, change, needle", [
    # the reference DDP honours bucket_cap_mb: a claim to honour it changes nothing
    ("dropped_bucket", {"honours": ("bucket_cap_mb",)}, "claims to honour ['bucket_cap_mb']"),
    ("comm_hook_no_divide", {"honours": ("mixed_precision",)}, "is torch-based"),
    ("comm_hook_no_divide", {"unsupported": {"tpu": "why"}}, "unknown runtime(s) ['tpu']"),
    ("fsdp2_no_divide", {"sync_bn": object}, "builds a shipped path's row"),
])
def test_mutant_claims_that_have_no_effect(mutant, change, needle):
    first = next(c.name for c in CASES.values() if mutant in c.must_kill)
    refused(rows(), f"row {first!r}", f"mutant {mutant!r}", needle, mutants=mutants(**{mutant: change}))


def test_a_reference_mutant_unsupported_on_a_runtime_is_unsupported_there():
    """A fault that never reaches one runtime's step (state_dict_collective's unused all-reduce,
    dropped from a lazy XLA graph) is unsupported there, never a survivor."""
    from conformance.impls.builtin import mutant_impl
    from conformance.impls.mutants.catalog import MUTANTS
    row = mutant_impl("state_dict_collective")
    assert MUTANTS["state_dict_collective"].unsupported == row.unsupported and set(row.unsupported) == {"pjrt"}
    assert not mutant_impl("sum_not_mean").unsupported


@pytest.mark.parametrize("mutant, change, claim", [
    ("dropped_bucket", {"honours": ("mixed_precision",)}, "['mixed_precision']"),
    ("no_grad_sync", {"sync_bn": object}, "['sync_bn']"),
])
def test_mutant_claims_no_row_that_must_kill_it_uses(mutant, change, claim):
    killers = [c.name for c in CASES.values() if mutant in c.must_kill]
    refused(rows(), str(killers), f"mutant {mutant!r} claims {claim}", mutants=mutants(**{mutant: change}))


def test_a_new_row_is_validated_like_the_others():
    new = Case("feature.no_sync_twice", "feature", "two no_sync windows", "task", "linear",
               task=CASES["feature.no_sync"].task, judge=None, checks=("inside",))
    refused(rows() + [new], "row 'feature.no_sync_twice'", "task and judge")
