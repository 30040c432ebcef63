"""Hypothesis properties of gradient sync as cases of the table.

Each property is a factory ``prop(runner, measure) -> hypothesis test`` (:data:`PROPERTIES`):
examples are drawn in the evaluating process (:mod:`.strategies`), shipped to every replica of
the runner's persistent world with ``runner.run(<task>, **payload)`` (:mod:`.tasks`; the world
is reused for every example, never respawned) and judged in the evaluating process
(:mod:`.oracles`; every bound in :mod:`conformance.cases.shared.numerics`). :func:`run_property`
runs one property within an example budget (:mod:`conformance.cases.shared.search`) and returns
the fields of a verdict: the worst use of the bound over all examples (max deviation, bound,
margin) on a pass, and the shrunk counterexample on a failure.

The properties, numbered as the kit's docs count them (what each asserts: its row's description
in the case table): 1 ``allreduce_mean`` (within
:func:`conformance.cases.shared.numerics.allreduce_bound` of the float64 mean), 2
``full_batch_grad``, 3 ``rank_permutation``, 4 ``broadcast``, 5 ``no_sync_accumulation``, 6
``scale_linearity``.
"""
from __future__ import annotations

from hypothesis import given, note
from hypothesis import strategies as st

from conformance.cases.kinds import Kind
from conformance.cases.property.oracles import (Measure, accumulated_grads, check_allreduce_mean, compare_grads,
                                                full_batch_grads, state_difference, state_mismatch)
from conformance.cases.property.strategies import (allreduce_examples, bn_examples, mlp_examples,
                                                   nontrivial_permutations, scales)
from conformance.cases.property.tasks import (allreduce_mean_task, broadcast_task, mlp_grad_task, no_sync_task,
                                              scaled_grad_task)
from conformance.cases.shared.numerics import ALLREDUCE_DTYPES, DEFAULT_ALLREDUCE_DTYPES, GRAD_TOLERANCES
from conformance.cases.shared.search import SearchRunner, kit_settings, profile_examples
from conformance.errors import Unsupported
from conformance.worlds.runtimes import get_runtime
from conformance.verdict import Verdict

#: The bound of the gradient properties 2, 3, 5 and 6.
GRAD_TOLERANCE = GRAD_TOLERANCES["float32"]


def _few(t) -> bool:
    """Whether runner ``t``'s examples draw from a few shapes (each distinct graph a compilation)."""
    return get_runtime(t.runtime).compiled_graphs


def _label(t) -> str:
    """What runner ``t`` searches on, noted for Hypothesis' report of a failing example."""
    note(f"searched on: {t.describe()}")
    return t.describe()


def allreduce_mean(t, m):
    dtypes = ALLREDUCE_DTYPES.get(t.runtime, DEFAULT_ALLREDUCE_DTYPES)

    @given(ex=allreduce_examples(t.world_size, dtypes))
    def prop(ex):
        _label(t)
        check_allreduce_mean(ex, t.run(allreduce_mean_task, **ex.payload()), m)
    return prop


def full_batch_grad(t, m):
    @given(ex=mlp_examples(t.world_size, few_shapes=_few(t)))
    def prop(ex):
        who = _label(t)
        expected = full_batch_grads(ex.widths, ex.seed, ex.x[0], ex.y[0])
        for r, res in enumerate(t.run(mlp_grad_task, **ex.payload())):
            compare_grads(res["grads"], expected, GRAD_TOLERANCE, measure=m, replica=r,
                          what=f"{who}: replica {r} vs single-device gradient on the global "
                               f"batch (widths={ex.widths}, local_batch={ex.local_batch})")
    return prop


def rank_permutation(t, m):
    @given(ex=mlp_examples(t.world_size, few_shapes=_few(t)), perm=nontrivial_permutations(t.world_size))
    def prop(ex, perm):
        who = _label(t)
        for r, res in enumerate(t.run(mlp_grad_task, perm=perm, **ex.payload())):
            compare_grads(res["perm_grads"], res["grads"], GRAD_TOLERANCE, measure=m, replica=r,
                          what=f"{who}: replica {r}, shards permuted by {perm} vs identity "
                               f"(widths={ex.widths}, local_batch={ex.local_batch})")
    return prop


def broadcast(t, m):
    @given(ex=bn_examples(t.world_size, few_shapes=_few(t)))
    def prop(ex):
        who = _label(t)
        res = t.run(broadcast_task, **ex.payload())
        rank0 = res[0]["before"]
        for r in range(1, t.world_size):  # the setup really is rank-dependent
            assert state_mismatch(res[r]["before"], rank0), \
                f"{who}: vacuous example, replica {r} was built equal to replica 0"
        for r in range(t.world_size):
            for got, want, what in ((res[r]["first"], rank0, "after DDP construction replica {r} != rank 0's state"),
                                    (res[r]["second"], res[r]["first"], "constructing a second DDP changed replica {r}")):
                diff = state_difference(got, want)
                if diff is not None:
                    m.fail_at(diff[1], 0.0, r)  # exact comparison: bound 0
                assert diff is None, f"{who}: {what.format(r=r)}: {diff[0]}"
        m.add([0.0], [0.0])  # exact comparison: any deviation fails above
    return prop


def no_sync_accumulation(t, m):
    @given(ex=mlp_examples(t.world_size, micro_steps=st.integers(2, 4), few_shapes=_few(t)))
    def prop(ex):
        who = _label(t)
        k = len(ex.x)
        expected = accumulated_grads(ex.widths, ex.seed, ex.x, ex.y)
        for r, res in enumerate(t.run(no_sync_task, **ex.payload())):
            compare_grads(res["grads"], expected, GRAD_TOLERANCE, scale=k, measure=m, replica=r,
                          what=f"{who}: replica {r}, {k - 1} no_sync micro-step(s) + 1 synced vs "
                               f"sum of {k} global-batch gradients (widths={ex.widths}, "
                               f"local_batch={ex.local_batch})")
    return prop


def scale_linearity(t, m):
    @given(ex=mlp_examples(t.world_size, few_shapes=_few(t)), c=scales())
    def prop(ex, c):
        who = _label(t)
        for r, res in enumerate(t.run(scaled_grad_task, c=c, **ex.payload())):
            expected = [(n, None if g is None else c * g.astype("float64")) for n, g in res["grads"]]
            compare_grads(res["scaled_grads"], expected, GRAD_TOLERANCE, scale=abs(c), measure=m, replica=r,
                          what=f"{who}: replica {r}, gradient of {c!r} * loss vs {c!r} * "
                               f"gradient of loss (widths={ex.widths}, local_batch={ex.local_batch})")
    return prop


#: The property kind's registry (a property row's ``prop`` names one):
#: ``factory(runner, measure) -> Hypothesis test``.
PROPERTIES = {f.__name__: f for f in (allreduce_mean, full_batch_grad, rank_permutation, broadcast,
                                      no_sync_accumulation, scale_linearity)}


def run_property(name: str, runner: SearchRunner, max_examples: int, shrink: bool = True) -> dict:
    """Run property ``name`` on ``runner`` with ``max_examples`` examples (a failing example
    shrunk unless ``shrink`` is false). Returns verdict fields: ``status``, ``max_dev``, ``atol``
    (the bound at the worst element), ``margin``, ``reason`` and ``diagnosis`` (Hypothesis' report).

    Raises:
        Unsupported: the implementation cannot serve the property.
    """
    measure = Measure()
    test = kit_settings(max_examples, shrink)(PROPERTIES[name](runner, measure))
    try:
        test()
    except Exception as exc:
        if isinstance(runner.error, Unsupported):
            raise runner.error from None
        notes = "\n".join(getattr(exc, "__notes__", []))
        text = f"{notes}\n{type(exc).__name__}: {exc}".strip()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if runner.error is not None:
            first = f"replica failure: {first}"
        out = {"status": "fail", "reason": f"counterexample after {runner.runs} example(s): {first[:300]}",
               "diagnosis": text, "max_dev": float("nan"), "atol": float("nan"), "margin": float("nan")}
        f = measure.failed  # the counterexample's own figures (what the reason names)
        if f is not None and runner.error is None:
            out.update(max_dev=f["dev"], atol=f["bound"], replica=f["replica"],
                       margin=f["bound"] / f["dev"] if f["dev"] else float("inf"))
        return out
    out = {"status": "pass", "max_dev": measure.dev, "atol": measure.bound,
           "margin": (1 / measure.ratio) if measure.ratio else float("inf"),
           "reason": f"{runner.runs} example(s); worst use of the bound {measure.ratio:.3g}"}
    if runner.runs < max_examples:
        out.update(status="vacuous", reason=f"ran {runner.runs} example(s), the budget asks {max_examples}")
    return out


def evaluate_property(case, impl, runtime, w, session, overrides):
    """Verdict of a ``property`` row: its property within the session profile's budget
    (``overrides["shrink"]``: shrink a failing example, default true)."""
    runner = SearchRunner(lambda fn, **p: session.run(runtime, w, fn, **p), runtime, w, impl)
    fields = run_property(case.prop, runner, profile_examples(session.profile), overrides.get("shrink", True))
    return [Verdict(case.name, "property", impl, runtime, case.model, w, **fields)]


def _property_problem(case) -> str | None:
    return None if case.prop in PROPERTIES else f"unknown property {case.prop!r}; known: {', '.join(PROPERTIES)}"


KIND = Kind("property", evaluate_property, validate=_property_problem, searches=True)
