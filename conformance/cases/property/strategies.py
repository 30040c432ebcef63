"""Hypothesis strategies of the gradient-sync properties (test process): every example
records the world size it is for."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance.cases.shared.numerics import DEFAULT_ALLREDUCE_DTYPES, MAX_ELEMENTS, MAX_MAGNITUDE


@st.composite
def shapes(draw, max_dims: int = 4, max_elements: int = MAX_ELEMENTS):
    """Shapes of rank 0..``max_dims`` with at most ``max_elements`` elements."""
    ndim = draw(st.integers(0, max_dims))
    shape, budget = [], max_elements
    for _ in range(ndim):
        side = draw(st.integers(1, max(1, budget)))
        shape.append(side)
        budget //= side
    return tuple(shape)


def _to_dtype_grid(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 ``x`` made exactly representable in ``dtype`` (bfloat16: keep the
    upper 16 bits of each float32, i.e. truncate the significand to 8 bits)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    return x


#: Dense backgrounds of a property-1 tensor (shrinks towards "zeros").
BACKGROUNDS = ("zeros", "normal", "mixed", "cancelling")


def _background(kind: str, seed: int, rank: int, shape) -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    size = int(np.prod(shape, dtype=np.int64))
    if kind == "zeros":
        x = np.zeros(size)
    elif kind == "normal":
        x = rng.standard_normal(size)
    elif kind == "mixed":  # log-uniform magnitudes from subnormal (2**-149) to 2**100, random signs
        x = rng.choice([-1.0, 1.0], size) * (1 + rng.random(size)) * np.exp2(rng.integers(-149, 100, size))
    else:  # "cancelling": replicas carry +-the same values plus small per-replica noise
        base = np.random.default_rng([seed]).standard_normal(size) * 2.0 ** 20
        x = (-1.0) ** rank * base + rng.standard_normal(size)
    return x.astype(np.float32).reshape(shape)


@dataclass(frozen=True, eq=False)
class AllReduceExample:
    """Property 1: ``xs[r]`` is replica ``r``'s gradient (float32 numpy holding
    values exactly representable in ``dtype``)."""

    world_size: int
    dtype: str
    shape: tuple
    xs: list = field(repr=True)

    def payload(self) -> dict:
        return {"xs": self.xs, "dtype": self.dtype}


@st.composite
def allreduce_examples(draw, world_size: int, dtypes=DEFAULT_ALLREDUCE_DTYPES):
    """Per-replica tensors: rank 0..4, <= ``MAX_ELEMENTS`` elements, finite float32/bfloat16 values
    incl. subnormals, zeros of both signs and magnitudes up to ``MAX_MAGNITUDE``: a dense
    background (:data:`BACKGROUNDS`) overlaid with Hypothesis-drawn elements (which shrink to
    small, readable tensors)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes())
    kind = draw(st.sampled_from(BACKGROUNDS))
    seed = draw(st.integers(0, 2 ** 32 - 1)) if kind != "zeros" else 0
    elements = st.floats(-MAX_MAGNITUDE, MAX_MAGNITUDE, width=32, allow_subnormal=True)
    xs = []
    for r in range(world_size):
        sparse = draw(hnp.arrays(np.float32, shape, elements=elements, fill=st.just(np.float32("nan"))))
        x = np.where(np.isnan(sparse), _background(kind, seed, r, shape), sparse)
        xs.append(_to_dtype_grid(x, dtype).reshape(shape))
    return AllReduceExample(world_size, dtype, shape, xs)


@dataclass(frozen=True, eq=False)
class MlpExample:
    """Properties 2, 3, 5, 6: an MLP and ``micro_steps`` global batches ``x[j]`` ``[world_size *
    local_batch, widths[0]]``, ``y[j]`` ``[world_size * local_batch, widths[-1]]``; shard ``s`` is
    rows ``[s * local_batch, (s + 1) * local_batch)``."""

    world_size: int
    widths: tuple
    seed: int
    local_batch: int
    x: np.ndarray
    y: np.ndarray

    def payload(self) -> dict:
        return {"widths": self.widths, "seed": self.seed, "x": self.x, "y": self.y}


#: Where every distinct graph is a compilation (a runtime's ``compiled_graphs``: XLA), the
#: examples draw their shapes from these few, which repeat across examples so the compile
#: cache serves most of them; they keep the corners of the full draw (one layer and four,
#: widths 1 and 12, local batch 1 and more). What they save: benchmarks/README.md.
FEW_MLP_WIDTHS = ((1, 12), (12, 1), (5, 3, 8), (2, 12, 1, 7), (9, 4, 6, 2, 11))
FEW_LOCAL_BATCHES = (1, 3, 8)
FEW_BN_WIDTHS = ((4, 12, 3), (1, 7, 5, 2))


@st.composite
def mlp_examples(draw, world_size: int, micro_steps=st.just(1), few_shapes: bool = False):
    """Random small MLPs: 1..4 Linear layers of widths 1..12, seeded init; local
    batch 1..8; N(0, 1) inputs and targets from a drawn seed. ``few_shapes``: widths
    and local batch from :data:`FEW_MLP_WIDTHS` / :data:`FEW_LOCAL_BATCHES`."""
    if few_shapes:
        widths = draw(st.sampled_from(FEW_MLP_WIDTHS))
    else:
        depth = draw(st.integers(1, 4))
        widths = tuple(draw(st.integers(1, 12)) for _ in range(depth + 1))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    local_batch = draw(st.sampled_from(FEW_LOCAL_BATCHES) if few_shapes else st.integers(1, 8))
    k = draw(micro_steps)
    data_seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(data_seed)
    n = world_size * local_batch
    x = rng.standard_normal((k, n, widths[0])).astype(np.float32)
    y = rng.standard_normal((k, n, widths[-1])).astype(np.float32)
    return MlpExample(world_size, widths, seed, local_batch, x, y)


@dataclass(frozen=True)
class BnExample:
    """Property 4: replica ``r`` builds ``build_bn_net(widths, rank_seed(seed, r))``."""

    world_size: int
    widths: tuple
    seed: int

    def payload(self) -> dict:
        return {"widths": self.widths, "seed": self.seed}


@st.composite
def bn_examples(draw, world_size: int, few_shapes: bool = False):
    """BatchNorm nets of 2..3 layers of widths 1..12 (``few_shapes``: :data:`FEW_BN_WIDTHS`)."""
    if few_shapes:
        widths = draw(st.sampled_from(FEW_BN_WIDTHS))
    else:
        depth = draw(st.integers(2, 3))
        widths = tuple(draw(st.integers(1, 12)) for _ in range(depth + 1))
    return BnExample(world_size, widths, draw(st.integers(0, 2 ** 31 - 1)))


def nontrivial_permutations(n: int):
    """Permutations of ``range(n)`` that move something (identity -> rotation by one)."""
    def fix(p):
        p = list(p)
        return p if p != list(range(n)) else p[1:] + p[:1]
    return st.permutations(range(n)).map(fix)


def scales():
    """Loss scales ``c``: finite, ``1e-3 <= |c| <= 1e3``, either sign."""
    mag = st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False)
    return st.tuples(st.sampled_from([1.0, -1.0]), mag).map(lambda t: t[0] * t[1])
