"""Numbers the kinds share: the rounding constants of every floating dtype and Higham's
:func:`gamma`, which bound a sum in any order (the collective family's
:func:`~conformance.cases.collective.ops.sum_bound`, the gradient all-reduce's
:func:`allreduce_bound`); the gradient-sync properties' example sizes, dtypes and tolerances."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


#: Largest element count of a property-1 tensor.
MAX_ELEMENTS = 10_000
#: |x| <= 2**100 keeps sums of <= 16 replicas ~2**104, far from float32/bfloat16
#: overflow (~2**128), so every example is finite all the way through.
MAX_MAGNITUDE = 2.0 ** 100

#: Unit roundoff u = 2**-t (t = significand bits incl. the implicit one) and smallest positive
#: normal number lambda, per floating dtype (IEEE 754; bfloat16 has binary32's exponent range and
#: 8 significand bits; complex64 is judged per real component, at float32's). The order is the
#: collective family's draw order (:data:`~conformance.cases.collective.ops.FLOATS`).
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24,
                 "float64": 2.0 ** -53, "complex64": 2.0 ** -24}
SMALLEST_NORMAL = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126,
                   "float64": 2.0 ** -1022, "complex64": 2.0 ** -126}
#: The float64 oracles' own unit roundoff.
FLOAT64_UNIT_ROUNDOFF = UNIT_ROUNDOFF["float64"]

#: dtypes property 1 pushes through each runtime. bfloat16 on CPU: gloo's all-reduce supports it
#: (torch's DDP and the reference DDP reduce bfloat16 gradients). Not on PJRT: XLA's CPU backend
#: (torch_xla 2.9) rejects it at execution, "AllReduce for datatype 'bf16' is not supported".
ALLREDUCE_DTYPES = {"cpu": ("float32", "bfloat16"), "pjrt": ("float32",)}
DEFAULT_ALLREDUCE_DTYPES = ("float32",)


@dataclass(frozen=True)
class GradTolerance:
    """Elementwise bound ``|actual - expected| <= atol * scale + rtol * |expected|``.

    ``scale`` is 1 except where the compared gradient is a sum of ``k`` gradients
    (``k`` micro-steps: scale ``k``) or a gradient times ``c`` (scale ``|c|``).
    """

    atol: float
    rtol: float
    note: str = ""


#: The one table of tolerances of properties 2, 3, 5 and 6 (float32 gradients of
#: small tanh MLPs on N(0, 1) data, weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
#: so gradient elements are O(1e-3 .. 1)).
GRAD_TOLERANCES = {
    "float32": GradTolerance(
        atol=1e-5, rtol=1e-4,
        note="measured on CPU (torch 2.13, gloo), ci profile, ref and torch DDP, world "
             "sizes 2 and 4: correct DDPs deviate by <= 5.3e-7 * scale (summation order "
             "of shards vs one batch), i.e. <= 1.1% of this bound; the mutants the "
             "properties target deviate by O(1e-2 .. 1)"),
}


def gamma(k: int, u: float) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)`` (requires ``k u < 1``)."""
    assert k * u < 1, (k, u)
    return k * u / (1 - k * u)


def allreduce_bound(xs: np.ndarray, dtype: str) -> np.ndarray:
    """Elementwise bound on ``|DDP mean - exact mean|`` of ``n`` replica gradients.

    ``xs`` is ``[n, ...]`` (the replicas' gradients, exactly representable in
    ``dtype``). Returns ``[...]``:

    ``(gamma_{n+2}(u) + gamma_n(u64)) * sum_i |x_i| / n + 2 (n + 1) lambda``

    Source: N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
    ed., SIAM 2002. Model (2.4) ``fl(a op b) = (a op b)(1 + delta)``,
    ``|delta| <= u``; Lemma 3.1 ``prod (1 + delta_i) = 1 + theta_k``,
    ``|theta_k| <= gamma_k``; and (4.4) ``|s_hat - s| <= gamma_{n-1} sum |x_i|``
    for summation of ``n`` terms in *any* order (ring, tree, or recursive: each
    term passes through at most ``n - 1`` additions). A DDP computes the mean
    either as ``fl(fl(sum) * fl(1/n))`` (reference DDP, XLA) or as
    ``sum fl(x_i * fl(1/n))`` (torch DDP pre-divides each gradient, then
    all-reduces); either way each term carries at most ``n - 1`` addition
    roundings + 1 rounding of ``1/n`` + 1 rounding of the product = ``n + 1``
    factors; one more factor is allowed for a double rounding through a wider
    intermediate (bfloat16 arithmetic is done in float32 and rounded back), so
    ``gamma_{n+2}(u)``. The exact mean is computed in float64, whose own
    recursive sum of ``n`` terms and division add ``gamma_n(2**-53)``.

    The absolute term covers underflow: with gradual underflow Higham's model
    (2.8) adds ``|eta| <= lambda u`` per multiplication (additions of
    subnormals are exact); with flush-to-zero / denormals-are-zero (some SIMD
    paths, XLA CPU) every input and every intermediate below ``lambda`` may be
    replaced by 0, which loses ``< lambda`` per operand or result. ``2 (n + 1)
    lambda`` bounds both (n inputs, n - 1 sums, <= n scalings, the result).

    The bound is derived, not fitted: a correct DDP's errors use a fraction of it (each
    ``allreduce_mean`` verdict states its worst use of the bound); docs/collectives.md ("The
    bound, and why") gives the collective family's form of the same derivation.
    """
    xs = np.asarray(xs, dtype=np.float64)
    n = xs.shape[0]
    u = UNIT_ROUNDOFF[dtype]
    rel = gamma(n + 2, u) + gamma(n, FLOAT64_UNIT_ROUNDOFF)
    return rel * np.abs(xs).sum(axis=0) / n + 2 * (n + 1) * SMALLEST_NORMAL[dtype]


def grad_bound(expected: np.ndarray, tol: GradTolerance, scale: float = 1.0) -> np.ndarray:
    """``tol.atol * scale + tol.rtol * |expected|`` elementwise."""
    return tol.atol * scale + tol.rtol * np.abs(np.asarray(expected, dtype=np.float64))
