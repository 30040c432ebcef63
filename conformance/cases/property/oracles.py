"""References and oracles of the gradient-sync properties (test process): ``check_*``
raise ``AssertionError`` naming the world size, the element or parameter that broke and the
tensors involved; ``full_batch_grads`` and friends compute single-device float32 references."""
from __future__ import annotations

import numpy as np

from conformance.cases.property.models import build_mlp, grads_of
from conformance.cases.shared.numerics import GradTolerance, allreduce_bound, grad_bound
from conformance.cases.property.strategies import AllReduceExample


def full_batch_grads(widths, seed: int, x: np.ndarray, y: np.ndarray) -> list:
    """``[(name, grad)]`` of the mean MSE of ``build_mlp(widths, seed)`` on the
    whole batch ``x, y`` on one CPU device, float32."""
    return accumulated_grads(widths, seed, x[None], y[None])


def accumulated_grads(widths, seed: int, x: np.ndarray, y: np.ndarray) -> list:
    """What ``k - 1`` ``no_sync`` micro-steps plus one synced step must give, for ``k = len(x)``
    global micro-batches ``x[j]``: torch DDP *accumulates* across micro-steps (the synced step
    all-reduces the sum and divides by the world size only), so the gradient is
    ``sum_j grad(mean MSE on global micro-batch j)``, not the mean over micro-steps."""
    import torch
    import torch.nn.functional as F
    module = build_mlp(widths, seed)
    for j in range(len(x)):
        F.mse_loss(module(torch.from_numpy(x[j])), torch.from_numpy(y[j])).backward()
    return grads_of(module)


def _fmt(a) -> str:
    return np.array2string(np.asarray(a), threshold=64, precision=9, max_line_width=120)


def check_allreduce_mean(ex: AllReduceExample, results: list, measure: Measure | None = None) -> None:
    """Property 1 oracle: every replica holds the same bits, the input's dtype
    and shape, and lies within :func:`allreduce_bound` of the float64 mean."""
    n = ex.world_size
    head = f"world_size={n} dtype={ex.dtype} shape={ex.shape}"
    for r, res in enumerate(results):
        assert res["dtype"] == ex.dtype, f"{head}: replica {r}'s gradient has dtype {res['dtype']}"
        assert np.shape(res["grad"]) == tuple(ex.shape), \
            f"{head}: replica {r}'s gradient has shape {np.shape(res['grad'])}"
    got = [np.ascontiguousarray(res["grad"], dtype=np.float32).reshape(-1) for res in results]
    xs = np.stack([np.asarray(x, dtype=np.float32).reshape(-1) for x in ex.xs])
    for r in range(1, n):
        diff = np.flatnonzero(got[r].view(np.uint32) != got[0].view(np.uint32))
        if len(diff):
            i = int(diff[0])
            if measure is not None:  # replica agreement is bitwise: bound 0
                measure.fail_at(abs(float(got[r][i]) - float(got[0][i])), 0.0, r)
            raise AssertionError(
                f"{head}: replicas 0 and {r} differ in {len(diff)} element(s); first at "
                f"{np.unravel_index(i, ex.shape) if ex.shape else ()}: results "
                f"{[float(g[i]) for g in got]!r}, inputs {xs[:, i].tolist()!r}")
    exact = xs.astype(np.float64).sum(axis=0) / n
    bound = allreduce_bound(xs, ex.dtype)
    err = np.abs(got[0].astype(np.float64) - exact)
    if measure is not None:
        measure.add(err, bound)
    bad = np.flatnonzero(~(err <= bound))
    if len(bad):
        i = int(bad[np.argmax(err[bad] / np.maximum(bound[bad], 1e-300))])
        if measure is not None:
            measure.fail_at(err[i], bound[i], 0)
        raise AssertionError(
            f"{head}: {len(bad)} element(s) outside the all-reduce bound; worst at "
            f"{np.unravel_index(i, ex.shape) if ex.shape else ()}: per-replica inputs "
            f"{xs[:, i].tolist()!r}, result {float(got[0][i])!r}, float64 mean {float(exact[i])!r}, "
            f"|error| {err[i]:.6g} > bound {bound[i]:.6g}\nresult (replica 0):\n{_fmt(got[0].reshape(ex.shape))}")


class Measure:
    """Worst use of a bound over a property's examples: ``ratio`` = max |dev| / bound,
    with the deviation and bound at that element (the verdict's max dev and atol)."""

    def __init__(self):
        self.ratio, self.dev, self.bound, self.examples = 0.0, 0.0, float("nan"), 0
        #: the figures of the last failed comparison (``dev``, ``bound``, ``replica``): Hypothesis
        #: replays the minimal counterexample last, so a failing verdict reports its numbers
        self.failed: dict | None = None

    def fail_at(self, dev: float, bound: float, replica: int | None) -> None:
        """Record the element a comparison is about to fail on (its reason names the same)."""
        self.failed = {"dev": float(dev), "bound": float(bound), "replica": replica}

    def add(self, dev: np.ndarray, bound: np.ndarray) -> None:
        dev, bound = np.asarray(dev, np.float64).reshape(-1), np.asarray(bound, np.float64).reshape(-1)
        if not dev.size:
            return
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(dev == 0, 0.0, dev / bound)
        i = int(np.nanargmax(np.where(np.isnan(r), np.inf, r)))
        if not (r[i] <= self.ratio):
            self.ratio, self.dev, self.bound = float(r[i]), float(dev[i]), float(bound[i])
        elif np.isnan(self.bound):
            self.bound = float(bound[i])


def compare_grads(actual: list, expected: list, tol: GradTolerance, *, scale: float = 1.0,
                  what: str, measure: Measure | None = None, replica: int | None = None) -> None:
    """Assert ``[(name, grad)]`` lists agree within ``grad_bound(expected, tol, scale)``;
    the message names ``what``, the parameter, the worst element and both tensors.
    ``measure`` (optional) records the worst use of the bound."""
    assert [n for n, _ in actual] == [n for n, _ in expected], \
        f"{what}: parameters {[n for n, _ in actual]} != {[n for n, _ in expected]}"
    for (name, a), (_, e) in zip(actual, expected):
        assert a is not None, f"{what}: parameter {name} has no gradient"
        assert np.shape(a) == np.shape(e), f"{what}: {name} gradient shape {np.shape(a)} != {np.shape(e)}"
        a64, e64 = np.asarray(a, np.float64), np.asarray(e, np.float64)
        dev = np.abs(a64 - e64)
        bound = grad_bound(e64, tol, scale)
        if measure is not None:
            measure.add(dev, bound)
        bad = ~(dev <= bound)
        if bad.any():
            i = np.unravel_index(int(np.argmax(np.where(bad, dev / bound, -1))), np.shape(a))
            if measure is not None:
                measure.fail_at(dev[i], bound[i], replica)
            raise AssertionError(
                f"{what}: parameter {name!r}: {int(bad.sum())} element(s) outside "
                f"atol*{scale:g} + rtol*|expected| (atol {tol.atol:g}, rtol {tol.rtol:g}); worst at "
                f"{tuple(int(j) for j in i)}: got {float(a64[i])!r}, expected {float(e64[i])!r}, |dev| {dev[i]:.3g} "
                f"> {bound[i]:.3g}\ngot:\n{_fmt(a)}\nexpected:\n{_fmt(e)}")


def state_difference(actual: list, expected: list) -> tuple[str, float] | None:
    """First difference (bitwise) between two ``[(name, array)]`` states: ``(why, dev)``, the
    text naming it and its max |difference| (inf when names, dtypes or shapes differ), or None."""
    if [n for n, _ in actual] != [n for n, _ in expected]:
        return f"state names {[n for n, _ in actual]} != {[n for n, _ in expected]}", float("inf")
    for (name, a), (_, e) in zip(actual, expected):
        a, e = np.asarray(a), np.asarray(e)
        if a.dtype != e.dtype or a.shape != e.shape:
            return f"{name}: {a.dtype}{a.shape} != {e.dtype}{e.shape}", float("inf")
        if a.tobytes() != e.tobytes():
            dev = np.abs(a.astype(np.float64) - e.astype(np.float64))
            return (f"{name}: {int((a != e).sum())} element(s) differ, max |dev| {dev.max():.6g}\n"
                    f"got:\n{_fmt(a)}\nexpected (rank 0):\n{_fmt(e)}"), float(dev.max())
    return None


def state_mismatch(actual: list, expected: list) -> str | None:
    """The text of :func:`state_difference`, or None."""
    diff = state_difference(actual, expected)
    return None if diff is None else diff[0]
