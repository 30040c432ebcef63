"""Property checks of gradient sync: strategies, World tasks and oracles.

The Hypothesis tests in ``conformance/cases/properties/run.py`` draw examples
in the test process with the strategies here, ship them to every replica of a
session's persistent :class:`~conformance.worlds.spawned.World` with
``world.run(<task>, impl=..., **payload)`` and judge the replicas' answers with
the oracles here. The world is reused for every example, never respawned.

Three kinds of functions live here:

* **strategies** (test process): ``allreduce_examples``, ``mlp_examples``,
  ``bn_examples``, ...; every example records the world size it is for;
* **tasks** (replicas): ``fn(ctx, *, impl, **payload)``; they build a model,
  wrap it with ``conformance.impls.builtin.resolve_impl(impl).wrap(module, ctx, {})``,
  train nothing (one or a few backward passes) and return numpy;
* **oracles** (test process): ``check_*`` raise ``AssertionError`` whose message
  names the world size, the element or parameter that broke and the tensors
  involved; ``full_batch_grads`` and friends compute single-device float32
  references.

Every tolerance the gradient properties use is in :data:`GRAD_TOLERANCES`; the
all-reduce bound is :func:`allreduce_bound` (derivation in its docstring).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance.cases.train.loop import rank_seed
from conformance.cases.train.readback import full
from conformance.impls.builtin import resolve_impl

# --------------------------------------------------------------------------
# numbers
# --------------------------------------------------------------------------

#: Largest element count of a property-1 tensor.
MAX_ELEMENTS = 10_000
#: |x| <= 2**100 keeps sums of <= 16 replicas ~2**104, far from float32/bfloat16
#: overflow (~2**128), so every example is finite all the way through.
MAX_MAGNITUDE = 2.0 ** 100

#: Unit roundoff u = 2**-t (t = significand bits incl. the implicit one) and
#: smallest positive normal number lambda, per dtype (IEEE 754 binary32; bfloat16
#: has binary32's exponent range and 8 significand bits).
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}
SMALLEST_NORMAL = {"float32": 2.0 ** -126, "bfloat16": 2.0 ** -126}
FLOAT64_UNIT_ROUNDOFF = 2.0 ** -53

#: dtypes property 1 pushes through each runtime. bfloat16 on CPU: gloo's
#: all-reduce supports it (measured with torch 2.13: both torch DDP and the
#: reference DDP reduce bfloat16 gradients). Not on PJRT: XLA's CPU backend
#: (torch_xla 2.9.0) rejects it at execution, "AllReduce for datatype 'bf16' is
#: not supported".
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

    Measured (CPU, gloo, torch 2.13, ref and torch DDP, world sizes 2 and 4, ci
    profile): errors use at most 34% (float32) / 38% (bfloat16) of the bound;
    subnormals see gradual underflow (no flush-to-zero) on this runtime.
    """
    xs = np.asarray(xs, dtype=np.float64)
    n = xs.shape[0]
    u = UNIT_ROUNDOFF[dtype]
    rel = gamma(n + 2, u) + gamma(n, FLOAT64_UNIT_ROUNDOFF)
    return rel * np.abs(xs).sum(axis=0) / n + 2 * (n + 1) * SMALLEST_NORMAL[dtype]


def grad_bound(expected: np.ndarray, tol: GradTolerance, scale: float = 1.0) -> np.ndarray:
    """``tol.atol * scale + tol.rtol * |expected|`` elementwise."""
    return tol.atol * scale + tol.rtol * np.abs(np.asarray(expected, dtype=np.float64))


# --------------------------------------------------------------------------
# models (built identically in replicas and in the test process)
# --------------------------------------------------------------------------

def _torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


def one_param_module(shape, dtype: str):
    """A module with one parameter ``p`` (zeros, ``shape``, ``dtype``) whose
    forward is ``(p * x).sum()``: the gradient of ``p`` is exactly ``x``."""
    import torch
    from torch import nn

    class OneParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(tuple(shape), dtype=_torch_dtype(dtype)))

        def forward(self, x):
            return (self.p * x).sum()
    return OneParam()


def build_mlp(widths, seed: int):
    """``Linear(widths[0], widths[1]) -> Tanh -> ... -> Linear(.., widths[-1])``,
    float32, weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from ``seed``."""
    import torch
    from torch import nn
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in model:
            if isinstance(lin, nn.Linear):
                bound = 1.0 / math.sqrt(lin.in_features)
                lin.weight.uniform_(-bound, bound, generator=gen)
                lin.bias.uniform_(-bound, bound, generator=gen)
    return model


def build_bn_net(widths, seed: int):
    """``[Linear -> BatchNorm1d -> Tanh] * (len(widths) - 2) -> Linear``, every
    parameter (BatchNorm affine included) and every buffer (running mean/var,
    ``num_batches_tracked``) drawn from ``seed``, so two seeds give two
    different module states."""
    import torch
    from torch import nn
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers += [nn.BatchNorm1d(widths[i + 1]), nn.Tanh()]
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-1.0, 1.0, generator=gen)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.normal_(generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
                m.num_batches_tracked.fill_(int(torch.randint(0, 10_000, (), generator=gen)))
    return model


# --------------------------------------------------------------------------
# strategies (test process)
# --------------------------------------------------------------------------

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
    """Per-replica tensors: rank 0..4, <= ``MAX_ELEMENTS`` elements, finite
    float32/bfloat16 values incl. subnormals, zeros of both signs and mixed
    magnitudes up to ``MAX_MAGNITUDE``: a dense background (zeros, normal,
    log-uniform mixed magnitudes, or cancelling across replicas) overlaid with
    Hypothesis-drawn elements (which shrink to small, readable tensors)."""
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
    """Properties 2, 3, 5, 6: an MLP and ``micro_steps`` global batches
    ``x[j]`` ``[world_size * local_batch, widths[0]]``, ``y[j]``
    ``[world_size * local_batch, widths[-1]]``; shard ``s`` is rows
    ``[s * local_batch, (s + 1) * local_batch)``."""

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
#: widths 1 and 12, local batch 1 and more). Measured in benchmarks/README.md (session 6).
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


# --------------------------------------------------------------------------
# tasks (replicas)
# --------------------------------------------------------------------------

def _wrap(impl: str, module, ctx):
    import torch

    row = resolve_impl(impl)
    module.to(ctx.device)
    ddp = row.wrap(module, ctx, {})
    opt = torch.optim.SGD(module.parameters(), lr=0.0)  # only for after_backward recipes
    return row, ddp, opt


def _after_backward(row, ddp, opt, ctx):
    if row.after_backward is not None:
        row.after_backward(ddp, opt, ctx)
    ctx.mark_step()


def _host(t):
    """``t`` on the host, as the optimizer sees it: copied *before* detaching. On
    PJRT (torch_xla 2.9.0, reference DDP) a gradient accumulated under
    ``no_sync`` and then all-reduced in place reads back synced through
    ``p.grad`` (and SGD applies the synced value) but stale - the local
    accumulated gradient - through ``p.grad.detach()``. A DTensor shard (FSDP2)
    is gathered first (a collective: every replica reads the same tensors)."""
    return full(t).cpu().detach()


def _grads(module) -> list:
    """``[(name, float32 numpy grad or None)]`` in ``parameters()`` order."""
    return [(n, None if p.grad is None else _host(p.grad).float().numpy().copy())
            for n, p in module.named_parameters()]


def _state(module) -> list:
    """``[(name, numpy)]`` of every parameter and buffer, dtype preserved
    (bfloat16 as float32, exactly)."""
    import torch
    out = []
    for n, t in list(module.named_parameters()) + list(module.named_buffers()):
        t = _host(t)
        out.append((n, (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()))
    return out


def allreduce_mean_task(ctx, *, impl: str, xs: list, dtype: str) -> dict:
    """Property 1: push ``xs[shard]`` through the DDP as the gradient of a
    one-parameter module; return the synced gradient (as float32) and its dtype."""
    import torch
    module = one_param_module(np.shape(xs[0]), dtype)
    row, ddp, opt = _wrap(impl, module, ctx)
    x = torch.from_numpy(np.array(xs[row.shard_rank(ctx)], dtype=np.float32).reshape(-1))
    # Moved as 1-d and reshaped on the device: torch_xla inlines a 0-dim 0.0 or
    # 1.0 as a constant, so a rank-dependent scalar would give replicas different
    # graphs (and XLA collectives that never meet).
    x = x.to(_torch_dtype(dtype)).to(ctx.device).reshape(np.shape(xs[0]))
    ddp(x).backward()
    _after_backward(row, ddp, opt, ctx)
    g = module.p.grad
    return {"grad": _host(g).float().numpy().copy(), "dtype": str(g.dtype).replace("torch.", "")}


def _shard(a, index: int, world_size: int):
    import torch
    n = len(a) // world_size
    return torch.from_numpy(np.ascontiguousarray(a[index * n:(index + 1) * n]))


def _mse_step(ddp, x, y, ctx, scale=1.0):
    import torch.nn.functional as F
    loss = F.mse_loss(ddp(x.to(ctx.device)), y.to(ctx.device))
    (loss * scale if scale != 1.0 else loss).backward()


def mlp_grad_task(ctx, *, impl: str, widths, seed: int, x, y, perm=None) -> dict:
    """Properties 2 and 3: one synced backward of the mean MSE on this replica's
    shard of ``x[0], y[0]``; with ``perm`` a second one (grads zeroed) on shard
    ``perm[shard]``. Returns ``{"grads": [...], "perm_grads": [...] or None}``."""
    module = build_mlp(widths, seed)
    row, ddp, opt = _wrap(impl, module, ctx)
    s, w = row.shard_rank(ctx), ctx.world_size
    _mse_step(ddp, _shard(x[0], s, w), _shard(y[0], s, w), ctx)
    _after_backward(row, ddp, opt, ctx)
    out = {"grads": _grads(module), "perm_grads": None}
    if perm is not None:
        opt.zero_grad(set_to_none=True)
        _mse_step(ddp, _shard(x[0], perm[s], w), _shard(y[0], perm[s], w), ctx)
        _after_backward(row, ddp, opt, ctx)
        out["perm_grads"] = _grads(module)
    return out


def broadcast_task(ctx, *, impl: str, widths, seed: int) -> dict:
    """Property 4: build the BatchNorm net from a rank-dependent seed, wrap it,
    wrap its module again; return the state before, after the first and after
    the second construction."""
    module = build_bn_net(widths, rank_seed(seed, ctx.rank))
    module.to(ctx.device)
    before = _state(module)
    row = resolve_impl(impl)
    row.wrap(module, ctx, {})
    ctx.mark_step()
    first = _state(module)
    row.wrap(module, ctx, {})
    ctx.mark_step()
    return {"before": before, "first": first, "second": _state(module)}


def no_sync_task(ctx, *, impl: str, widths, seed: int, x, y) -> dict:
    """Property 5: ``len(x) - 1`` backward passes under ``ddp.no_sync()``, then
    one synced backward; returns the gradients. Raises ``Unsupported`` when the
    DDP has no ``no_sync``."""
    module = build_mlp(widths, seed)
    row, ddp, opt = _wrap(impl, module, ctx)
    if not callable(getattr(ddp, "no_sync", None)):
        from conformance.errors import Unsupported
        raise Unsupported(f"{impl} has no no_sync()")
    s, w = row.shard_rank(ctx), ctx.world_size
    for j in range(len(x) - 1):
        with ddp.no_sync():
            _mse_step(ddp, _shard(x[j], s, w), _shard(y[j], s, w), ctx)
        ctx.mark_step()
    _mse_step(ddp, _shard(x[-1], s, w), _shard(y[-1], s, w), ctx)
    _after_backward(row, ddp, opt, ctx)
    return {"grads": _grads(module)}


def scaled_grad_task(ctx, *, impl: str, widths, seed: int, x, y, c: float) -> dict:
    """Property 6: synced gradients of the loss and (grads zeroed) of ``c * loss``."""
    module = build_mlp(widths, seed)
    row, ddp, opt = _wrap(impl, module, ctx)
    s, w = row.shard_rank(ctx), ctx.world_size
    xs, ys = _shard(x[0], s, w), _shard(y[0], s, w)
    _mse_step(ddp, xs, ys, ctx)
    _after_backward(row, ddp, opt, ctx)
    plain = _grads(module)
    opt.zero_grad(set_to_none=True)
    _mse_step(ddp, xs, ys, ctx, scale=c)
    _after_backward(row, ddp, opt, ctx)
    return {"grads": plain, "scaled_grads": _grads(module)}


# --------------------------------------------------------------------------
# references and oracles (test process)
# --------------------------------------------------------------------------

def full_batch_grads(widths, seed: int, x: np.ndarray, y: np.ndarray) -> list:
    """``[(name, grad)]`` of the mean MSE of ``build_mlp(widths, seed)`` on the
    whole batch ``x, y`` on one CPU device, float32."""
    import torch
    import torch.nn.functional as F
    module = build_mlp(widths, seed)
    F.mse_loss(module(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    return _grads(module)


def accumulated_grads(widths, seed: int, x: np.ndarray, y: np.ndarray) -> list:
    """What ``k - 1`` ``no_sync`` micro-steps plus one synced step must give,
    for ``k = len(x)`` global micro-batches ``x[j]``: torch DDP *accumulates*
    across micro-steps (each backward adds into ``.grad``; the synced step
    all-reduces the sum and divides by the world size only), so the gradient
    is ``sum_j grad(mean MSE on global micro-batch j)`` - not the mean over
    micro-steps, and not the gradient of one mean over all ``k`` batches
    (which is ``1/k`` of it)."""
    import torch
    import torch.nn.functional as F
    module = build_mlp(widths, seed)
    for j in range(len(x)):
        F.mse_loss(module(torch.from_numpy(x[j])), torch.from_numpy(y[j])).backward()
    return _grads(module)


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
