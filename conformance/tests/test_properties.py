"""Hypothesis property checks of gradient sync on the session's persistent worlds.

Examples are drawn here, in the test process, and shipped to every replica of
the ``world`` fixture's persistent world (``world.run(task, **payload)``); the
world is reused for every example. Each property runs for every implementation
of the runtime (``runtime_world`` x ``impl`` parametrization, as
``test_parity.py``) and is shown to catch a mutant of the catalog
(``test_property_catches_mutant``). Example counts come from the Hypothesis
profile (``--hypothesis-profile`` or env ``HYPOTHESIS_PROFILE``: ``ci``,
``dev``, ``thorough``; see ``conformance/plugin.py``).

The properties:

1. ``allreduce_mean`` - a gradient pushed through the DDP comes back as the
   replicas' mean, bit-identical on every replica, within
   :func:`conformance.properties.allreduce_bound` of the float64 mean;
2. ``full_batch_grad`` - synced gradients of a random MLP equal the
   single-device gradient on the global batch;
3. ``rank_permutation`` - permuting which replica gets which shard leaves the
   synced gradients unchanged;
4. ``broadcast`` - construction makes every replica hold rank 0's parameters and
   buffers bit-identically; constructing again changes nothing;
5. ``no_sync_accumulation`` - k ``no_sync`` micro-steps + one synced step give the
   sum of the per-micro-batch global-batch gradients;
6. ``scale_linearity`` - scaling every replica's loss by c scales the synced
   gradient by c.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import Phase, given, note, settings
from hypothesis import strategies as st

from conformance import properties as P
from conformance.impls import resolve_impl

TOL = P.GRAD_TOLERANCES["float32"]
# Examples a mutant run may use before Hypothesis must have found a counterexample
# (shrinking comes on top of these).
MUTANT_EXAMPLES = 30


@dataclass
class Target:
    """One (runtime, world size, implementation) the properties run against."""

    pool: object
    runtime: str
    world_size: int
    impl: str
    runs: int = 0

    def run(self, fn, **payload) -> list:
        # The pool hands back the session's persistent world (a new one only if
        # an earlier failure broke it).
        self.runs += 1
        return self.pool.get(self.runtime, self.world_size).run(fn, impl=self.impl, **payload)

    def describe(self) -> str:
        return f"impl={self.impl} runtime={self.runtime} world_size={self.world_size}"


def _label(t: Target, ex) -> str:
    """Add the target to Hypothesis' report of a failing example (which prints the
    shrunk example itself: world size, shapes, tensors); return it for messages."""
    note(f"target: {t.describe()}")
    return t.describe()


# --- the properties: factories returning a Hypothesis test for one target --

def prop_allreduce_mean(t: Target):
    dtypes = P.ALLREDUCE_DTYPES.get(t.runtime, P.DEFAULT_ALLREDUCE_DTYPES)

    @given(ex=P.allreduce_examples(t.world_size, dtypes))
    def allreduce_mean(ex):
        _label(t, ex)
        P.check_allreduce_mean(ex, t.run(P.allreduce_mean_task, **ex.payload()))
    return allreduce_mean


def prop_full_batch_grad(t: Target):
    @given(ex=P.mlp_examples(t.world_size))
    def full_batch_grad(ex):
        who = _label(t, ex)
        expected = P.full_batch_grads(ex.widths, ex.seed, ex.x[0], ex.y[0])
        for r, res in enumerate(t.run(P.mlp_grad_task, **ex.payload())):
            P.compare_grads(res["grads"], expected, TOL,
                            what=f"{who}: replica {r} vs single-device gradient on the global batch "
                                 f"(widths={ex.widths}, local_batch={ex.local_batch})")
    return full_batch_grad


def prop_rank_permutation(t: Target):
    @given(ex=P.mlp_examples(t.world_size), perm=P.nontrivial_permutations(t.world_size))
    def rank_permutation(ex, perm):
        who = _label(t, ex)
        for r, res in enumerate(t.run(P.mlp_grad_task, perm=perm, **ex.payload())):
            P.compare_grads(res["perm_grads"], res["grads"], TOL,
                            what=f"{who}: replica {r}, shards permuted by {perm} vs identity "
                                 f"(widths={ex.widths}, local_batch={ex.local_batch})")
    return rank_permutation


def prop_broadcast(t: Target):
    @given(ex=P.bn_examples(t.world_size))
    def broadcast(ex):
        who = _label(t, ex)
        res = t.run(P.broadcast_task, **ex.payload())
        rank0 = res[0]["before"]
        for r in range(1, t.world_size):  # the setup really is rank-dependent
            assert P.state_mismatch(res[r]["before"], rank0), \
                f"{who}: vacuous example, replica {r} was built equal to replica 0"
        for r in range(t.world_size):
            why = P.state_mismatch(res[r]["first"], rank0)
            assert why is None, f"{who}: after DDP construction replica {r} != rank 0's state: {why}"
            why = P.state_mismatch(res[r]["second"], res[r]["first"])
            assert why is None, f"{who}: constructing a second DDP changed replica {r}: {why}"
    return broadcast


def prop_no_sync_accumulation(t: Target):
    @given(ex=P.mlp_examples(t.world_size, micro_steps=st.integers(2, 4)))
    def no_sync_accumulation(ex):
        who = _label(t, ex)
        k = len(ex.x)
        expected = P.accumulated_grads(ex.widths, ex.seed, ex.x, ex.y)
        for r, res in enumerate(t.run(P.no_sync_task, **ex.payload())):
            if "unsupported" in res:
                pytest.skip(f"unsupported: {res['unsupported']}")
            P.compare_grads(res["grads"], expected, TOL, scale=k,
                            what=f"{who}: replica {r}, {k - 1} no_sync micro-step(s) + 1 synced vs "
                                 f"sum of {k} global-batch gradients (widths={ex.widths}, "
                                 f"local_batch={ex.local_batch})")
    return no_sync_accumulation


def prop_scale_linearity(t: Target):
    @given(ex=P.mlp_examples(t.world_size), c=P.scales())
    def scale_linearity(ex, c):
        who = _label(t, ex)
        for r, res in enumerate(t.run(P.scaled_grad_task, c=c, **ex.payload())):
            expected = [(n, None if g is None else c * g.astype("float64")) for n, g in res["grads"]]
            P.compare_grads(res["scaled_grads"], expected, TOL, scale=abs(c),
                            what=f"{who}: replica {r}, gradient of {c!r} * loss vs {c!r} * gradient "
                                 f"of loss (widths={ex.widths}, local_batch={ex.local_batch})")
    return scale_linearity


PROPERTIES = {
    "allreduce_mean": prop_allreduce_mean,
    "full_batch_grad": prop_full_batch_grad,
    "rank_permutation": prop_rank_permutation,
    "broadcast": prop_broadcast,
    "no_sync_accumulation": prop_no_sync_accumulation,
    "scale_linearity": prop_scale_linearity,
}

# Which mutant of conformance/mutants.py each property must catch.
CATCHES = {
    "allreduce_mean": "sum_not_mean",
    "full_batch_grad": "no_grad_sync",
    "rank_permutation": "last_param_unsynced",
    "broadcast": "no_initial_broadcast",
    "no_sync_accumulation": "no_grad_sync",
    "scale_linearity": "clip_local_grad",
}


@pytest.fixture
def target(runtime_world, impl, world, world_pool):
    runtime, w = runtime_world
    why = resolve_impl(impl).unsupported.get(runtime)
    if why:
        pytest.skip(f"unsupported: {why}")
    return Target(world_pool, runtime, w, impl)


# --- correct implementations: the property holds ----------------------------

def holds(prop, target: Target) -> None:
    """Run ``prop`` on ``target``; a run of fewer examples than the profile asks
    for checked less than it claims (never a pass that checked nothing)."""
    prop(target)()
    wanted = settings.default.max_examples
    assert target.runs >= wanted, f"{prop.__name__} ran {target.runs} example(s), profile asks {wanted}"


def test_allreduce_mean(target):
    holds(prop_allreduce_mean, target)


def test_full_batch_grad(target):
    holds(prop_full_batch_grad, target)


def test_rank_permutation(target):
    holds(prop_rank_permutation, target)


def test_broadcast(target):
    holds(prop_broadcast, target)


def test_no_sync_accumulation(target):
    holds(prop_no_sync_accumulation, target)


def test_scale_linearity(target):
    holds(prop_scale_linearity, target)


# --- mutants: the property finds, shrinks and reports a counterexample -----

@pytest.mark.parametrize("prop,mutant", [pytest.param(p, m, id=f"{p}-{m}") for p, m in CATCHES.items()])
def test_property_catches_mutant(prop, mutant, runtime_world, world, world_pool):
    runtime, w = runtime_world
    why = resolve_impl(f"mutant:{mutant}").unsupported.get(runtime)
    if why:
        pytest.skip(f"unsupported: {why}")
    t = Target(world_pool, runtime, w, f"mutant:{mutant}")
    # Shrinking stays on (the report must show a minimal example); the explain
    # phase (which lines only failing examples ran) is skipped: it costs more
    # runs than the search and says nothing about the tensors.
    phases = [ph for ph in settings.default.phases if ph != Phase.explain]
    test = settings(max_examples=MUTANT_EXAMPLES, phases=phases)(PROPERTIES[prop](t))
    with pytest.raises(AssertionError) as err:
        test()
    report = "\n".join(getattr(err.value, "__notes__", [])) + "\n" + str(err.value)
    # the shrunk example, headed "Failing test case" ("Falsifying example" in older Hypothesis)
    assert "Falsifying example" in report or "Failing test case" in report, report
    assert f"world_size={w}" in report and f"mutant:{mutant}" in report, report
