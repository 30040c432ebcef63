"""The collective ops table (:class:`Op`): each op's replica call (torch.distributed, completed
sync, by ``Work.wait`` or by ``Work.get_future``) and its host oracle (float64; integers exactly,
in int64). A result is judged bit for bit (a copy, a permutation, an integer reduction, MAX/MIN,
a PRODUCT of powers of two) except a floating SUM/AVG, held to :func:`sum_bound`. ``all_to_all``
(lists) sends equal chunks (gloo requires equal chunk sizes: uneven splits raise on some ranks
only); ``all_to_all_single`` carries the uneven splits; ``batch_isend_irecv`` is a ring.

Semantics mirrored: ``torch.distributed`` (torch 2.13 ``distributed_c10d``): ``reduce`` and
``gather`` define the result on the destination only, ``scatter`` reads the source's list,
``all_to_all_single`` sends ``input_split_sizes[j]`` elements to group rank ``j``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from conformance.cases.shared.numerics import FLOAT64_UNIT_ROUNDOFF, SMALLEST_NORMAL, UNIT_ROUNDOFF, gamma

#: The floating dtypes drawn: those with rounding constants (:data:`~conformance.cases.shared.numerics.UNIT_ROUNDOFF`).
FLOATS = tuple(UNIT_ROUNDOFF)
INTS = ("uint8", "int8", "int32", "int64")
#: Every dtype drawn; the ones a backend rejects come back ``unsupported`` with its message.
DTYPES = FLOATS + INTS + ("bool",)

#: Reductions a dtype is drawn with (torch's ReduceOp names). Bitwise ops are for integers
#: and bool; complex only sums (MAX/MIN/PRODUCT are not componentwise).
REDUCTIONS = {**{d: ("SUM", "AVG", "MAX", "MIN", "PRODUCT") for d in FLOATS},
              "complex64": ("SUM", "AVG"),
              **{d: ("SUM", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR") for d in INTS},
              "bool": ("MAX", "MIN", "BAND", "BOR")}

#: Sizes drawn (elements per chunk): 0, 1, primes, powers of two and their neighbours, and
#: sizes above gloo's chunking (its ring all-reduce splits buffers of >= 256 KiB).
SIZES = (0, 1, 2, 3, 5, 7, 8, 9, 13, 31, 32, 33, 127, 128, 129, 1023, 1024, 1025, 65535, 65536,
         65537, 262147)


def reduce_host(xs: list, red: str, dtype: str) -> np.ndarray:
    """``red`` over the group ranks' inputs ``xs`` (float64 / int64 / bool numpy arrays)."""
    a = np.stack(xs)
    if red in ("SUM", "AVG"):
        out = a.sum(axis=0)
        return out / len(xs) if red == "AVG" else out
    fn = {"MAX": np.max, "MIN": np.min, "PRODUCT": np.prod}.get(red)
    if fn is not None:
        return fn(a, axis=0)
    op = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[red]
    return op.reduce(a, axis=0)


def sum_bound(xs: list, red: str, dtype: str) -> np.ndarray:
    """Elementwise bound on ``|backend SUM (or AVG) - exact|`` of ``n`` inputs of ``dtype``.

    ``(gamma_{n+1}(u) + gamma_n(u64)) * sum_i |x_i| / d + 2 (n + 1) lambda`` with ``d`` = 1
    (SUM) or ``n`` (AVG): Higham's bound for a sum in any order (n - 1 roundings), one
    rounding of the division and one of a wider intermediate (half types are summed in
    float32), the float64 oracle's own sum; the absolute term covers flush-to-zero. The same
    derivation as the gradient all-reduce bound,
    :func:`conformance.cases.shared.numerics.allreduce_bound`. 0 for exact results.
    """
    n = len(xs)
    if dtype not in UNIT_ROUNDOFF or red not in ("SUM", "AVG"):
        return np.zeros_like(np.asarray(xs[0], dtype=np.float64))
    u = UNIT_ROUNDOFF[dtype]
    rel = gamma(n + 1, u) + gamma(n, FLOAT64_UNIT_ROUNDOFF)
    mag = np.abs(np.stack(xs).astype(np.float64)).sum(axis=0)
    return rel * mag / (n if red == "AVG" else 1) + 2 * (n + 1) * SMALLEST_NORMAL[dtype]


#: Memory layouts of a rank's input, each with the ops it applies to (the logical values are the
#: same; the oracle and the comparison read them in logical order). ``noncontiguous``: a stride-2 view
#: of a buffer twice as long (pytorch/pytorch#24836, #192920: gloo read such views as dense);
#: ``channels_last_input``: a ``(2, 3, h, 1)`` tensor in channels_last memory format, as DDP's
#: gradients of a channels_last module are; ``aliased_output``: the output buffer holds the input (the
#: in-place forms of ``all_gather_into_tensor`` and ``reduce_scatter_tensor``); ``reused_input``: the
#: same tensor object passes through the op twice, with other values the first time (DDP reduces the
#: same bucket storage every step: a backend that caches what it sent by the tensor's address
#: would send the old values). Not ``send_recv``: gloo refuses a non-dense ``send`` on the sender
#: only, and its receiver then waits forever.
LAYOUT_OPS = {
    "noncontiguous": ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter"),
    "channels_last_input": ("all_reduce", "broadcast", "reduce", "all_gather", "gather"),
    "aliased_output": ("all_gather_into_tensor", "reduce_scatter_tensor"),
    "reused_input": ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                     "all_to_all_single"),
}


def lay_out(x, layout: str | None):
    """``x`` (1-D) in ``layout`` (:data:`LAYOUT_OPS`), same logical values; ``None`` / ``aliased_output``:
    ``x`` itself (aliasing is made by the op's replica call). ``channels_last_input`` needs
    ``x.numel()`` a multiple of 6 with ``x.numel() >= 12`` (else it would be contiguous too)."""
    import torch
    if layout == "noncontiguous":
        buf = torch.zeros(2 * x.numel(), dtype=x.dtype)
        buf[1::2] = 1 if x.dtype != torch.bool else True  # the gaps differ from the data: a dense read shows
        view = buf[::2]
        view.copy_(x)
        return view
    if layout == "channels_last_input":
        h = x.numel() // 6
        assert h * 6 == x.numel() and h >= 2, x.numel()
        return x.reshape(2, 3, h, 1).contiguous(memory_format=torch.channels_last)
    return x


# --- replica side -------------------------------------------------------------------

def _call(fn, how, *args, **kw):
    """``fn(*args, **kw)`` completed ``how``: ``sync`` (blocking), ``wait`` (``async_op=True``,
    Work.wait) or ``future`` (Work.get_future)."""
    if how == "sync":
        return fn(*args, **kw)
    work = fn(*args, async_op=True, **kw)
    (work.get_future() if how == "future" else work).wait()


def _red(name):
    import torch.distributed as dist
    return getattr(dist.ReduceOp, name)


def splits(size: int, n: int, src: int) -> list:
    """Uneven all_to_all split sizes: what group rank ``src`` sends to each group rank."""
    return [(size + src + 2 * j) % 5 + (size if j == src else 0) for j in range(n)]


def r_all_reduce(x, g, ctx): _call(ctx["dist"].all_reduce, ctx["how"], x, op=_red(ctx["red"]), group=g); return x
def r_broadcast(x, g, ctx):
    _call(ctx["dist"].broadcast, ctx["how"], x, group_src=ctx.get("root", 0), group=g)
    return x


def r_reduce(x, g, ctx):
    root = ctx.get("root", 0)
    _call(ctx["dist"].reduce, ctx["how"], x, group_dst=root, op=_red(ctx["red"]), group=g)
    return x if ctx["grank"] == root else None


def r_all_gather(x, g, ctx):
    import torch
    outs = [torch.empty_like(x) for _ in range(ctx["n"])]
    _call(ctx["dist"].all_gather, ctx["how"], outs, x, group=g)
    return torch.cat(outs)


def r_all_gather_into_tensor(x, g, ctx):
    import torch
    out = torch.empty(x.numel() * ctx["n"], dtype=x.dtype)
    if ctx.get("layout") == "aliased_output":  # the input is this rank's slice of the output (in-place form)
        k = x.numel()
        x = out[ctx["grank"] * k:(ctx["grank"] + 1) * k].copy_(x)
    d = ctx["dist"]  # torch >= 2.10 deprecates all_gather_into_tensor for all_gather_single
    _call(getattr(d, "all_gather_single", None) or d.all_gather_into_tensor, ctx["how"], out, x, group=g)
    return out


def r_reduce_scatter(x, g, ctx):
    import torch
    out = torch.empty(x.numel() // ctx["n"], dtype=x.dtype)
    _call(ctx["dist"].reduce_scatter, ctx["how"], out, list(x.chunk(ctx["n"])) if x.numel() else
          [x[:0]] * ctx["n"], op=_red(ctx["red"]), group=g)
    return out


def r_reduce_scatter_tensor(x, g, ctx):
    import torch
    k = x.numel() // ctx["n"]
    # aliased: the output is this rank's chunk of the input (torch's in-place form)
    aliased = ctx.get("layout") == "aliased_output"
    out = x[ctx["grank"] * k:(ctx["grank"] + 1) * k] if aliased else torch.empty(k, dtype=x.dtype)
    d = ctx["dist"]  # torch >= 2.10 deprecates reduce_scatter_tensor for reduce_scatter_single
    _call(getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor, ctx["how"], out, x,
          op=_red(ctx["red"]), group=g)
    return out


def r_all_to_all_single(x, g, ctx):
    import torch
    n, me, size = ctx["n"], ctx["grank"], ctx["size"]
    out_splits = [splits(size, n, j)[me] for j in range(n)]
    out = torch.empty(sum(out_splits), dtype=x.dtype)
    _call(ctx["dist"].all_to_all_single, ctx["how"], out, x, out_splits, splits(size, n, me), group=g)
    return out


def r_all_to_all(x, g, ctx):
    import torch
    n = ctx["n"]
    outs = [torch.empty(x.numel() // n, dtype=x.dtype) for _ in range(n)]
    _call(ctx["dist"].all_to_all, ctx["how"], outs, list(x.chunk(n)) if x.numel() else [x[:0]] * n, group=g)
    return torch.cat(outs)


def r_batch_isend_irecv(x, g, ctx):
    import torch
    d, n, me = ctx["dist"], ctx["n"], ctx["grank"]
    out = torch.empty_like(x)
    works = d.batch_isend_irecv([d.P2POp(d.isend, x, group=g, group_peer=(me + 1) % n),
                                 d.P2POp(d.irecv, out, group=g, group_peer=(me - 1) % n)])
    for w in works:  # Work.wait in every mode: gloo's p2p Work has no future, and a refusal after
        w.wait()     # the isend would leave its message for the next draw's irecv
    return out


def r_gather(x, g, ctx):
    import torch
    root = ctx.get("root", 0)
    outs = [torch.empty_like(x) for _ in range(ctx["n"])] if ctx["grank"] == root else None
    _call(ctx["dist"].gather, ctx["how"], x, outs, group_dst=root, group=g)
    return torch.cat(outs) if outs is not None else None


def r_scatter(x, g, ctx):
    import torch
    out = torch.empty(x.numel() // ctx["n"], dtype=x.dtype)
    ins = list(x.chunk(ctx["n"])) if x.numel() else [x[:0]] * ctx["n"]
    root = ctx.get("root", 0)
    _call(ctx["dist"].scatter, ctx["how"], out, ins if ctx["grank"] == root else None, group_src=root, group=g)
    return out


def r_send_recv(x, g, ctx):
    import torch
    d, n, me = ctx["dist"], ctx["n"], ctx["grank"]
    out = torch.empty_like(x)
    if me % 2 == 0:  # even ranks send first: a ring of blocking calls without deadlock
        d.send(x, group_dst=(me + 1) % n, group=g)
        d.recv(out, group_src=(me - 1) % n, group=g)
    else:
        d.recv(out, group_src=(me - 1) % n, group=g)
        d.send(x, group_dst=(me + 1) % n, group=g)
    return out


def r_barrier(x, g, ctx):
    _call(ctx["dist"].barrier, ctx["how"], group=g)
    return x


# --- host side ------------------------------------------------------------------------

def _cat(parts):
    return np.concatenate(parts) if parts else np.zeros(0)


def _chunk(a, n, i):
    k = len(a) // n
    return a[i * k:(i + 1) * k]


@dataclass(frozen=True)
class Op:
    """One collective: ``length(size, n, grank)`` input elements per group rank, ``replica(x, group,
    ctx)`` -> the rank's result tensor (or None where undefined), ``oracle(xs, grank, red, size)``
    -> expected float64/int64 array (or None); ``reduces``: takes a ReduceOp; ``agree``: every
    group rank holds the same bits; ``p2p``: needs >= 2 group ranks; ``rooted``: the op has a
    source or destination (a draw's ``root``, a group rank; its oracle takes ``root=``)."""

    name: str
    replica: Callable
    oracle: Callable
    length: Callable = lambda size, n, me: size
    reduces: bool = False
    agree: bool = False
    p2p: bool = False
    rooted: bool = False


def _a2a_oracle(xs, me, red, size):
    n = len(xs)
    return _cat([np.split(xs[j], np.cumsum(splits(size, n, j))[:-1])[me] for j in range(n)])


OPS = {o.name: o for o in (
    Op("all_reduce", r_all_reduce, lambda xs, me, red, size: reduce_host(xs, red, ""), reduces=True, agree=True),
    Op("broadcast", r_broadcast, lambda xs, me, red, size, root=0: xs[root], agree=True, rooted=True),
    Op("reduce", r_reduce, lambda xs, me, red, size, root=0: reduce_host(xs, red, "") if me == root else None,
       reduces=True, rooted=True),
    Op("all_gather", r_all_gather, lambda xs, me, red, size: _cat(xs), agree=True),
    Op("all_gather_into_tensor", r_all_gather_into_tensor, lambda xs, me, red, size: _cat(xs), agree=True),
    Op("reduce_scatter", r_reduce_scatter, lambda xs, me, red, size: _chunk(reduce_host(xs, red, ""), len(xs), me),
       length=lambda size, n, me: size * n, reduces=True),
    Op("reduce_scatter_tensor", r_reduce_scatter_tensor,
       lambda xs, me, red, size: _chunk(reduce_host(xs, red, ""), len(xs), me),
       length=lambda size, n, me: size * n, reduces=True),
    Op("all_to_all_single", r_all_to_all_single, _a2a_oracle, length=lambda size, n, me: sum(splits(size, n, me))),
    Op("all_to_all", r_all_to_all, lambda xs, me, red, size: _cat([_chunk(x, len(xs), me) for x in xs]),
       length=lambda size, n, me: size * n),
    Op("gather", r_gather, lambda xs, me, red, size, root=0: _cat(xs) if me == root else None, rooted=True),
    Op("scatter", r_scatter, lambda xs, me, red, size, root=0: _chunk(xs[root], len(xs), me),
       length=lambda size, n, me: size * n, rooted=True),
    Op("barrier", r_barrier, lambda xs, me, red, size: xs[me]),
    Op("send_recv", r_send_recv, lambda xs, me, red, size: xs[(me - 1) % len(xs)], p2p=True),
    Op("batch_isend_irecv", r_batch_isend_irecv, lambda xs, me, red, size: xs[(me - 1) % len(xs)], p2p=True),
)}
