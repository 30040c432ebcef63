"""The draws of the collective family's op cases (:func:`plan`, :func:`plan_layout`,
deterministic) and every group rank's input, regenerated from the draw's seed on every rank
(:func:`make_input`), so no tensor crosses the pipe.
"""
from __future__ import annotations

import hashlib

from conformance.cases.collective.ops import DTYPES, FLOATS, INTS, LAYOUT_OPS, OPS, REDUCTIONS, SIZES

#: Completion modes drawn: blocking call, ``async_op=True`` + ``Work.wait()``, + ``get_future().wait()``.
HOWS = ("sync", "wait", "future")
#: Draws per (dtype, reduction) pair, by profile (ops without a reduction take as many per
#: dtype as cover every size). dev: the default run (its cost: docs/collectives.md, "What it costs").
REPEATS = {"dev": 1, "ci": 1, "ci-pjrt": 1, "thorough": 4}
#: Seed of the inputs (a draw's inputs depend on it, the op, the draw index and the group rank).
SEED = 2027
#: Ranks at or above this hold 1 in a PRODUCT, so a product of 2^{+-1} factors stays exact in
#: every dtype (float16's largest finite value is 65504 < 2^16; int8 wraps above 127).
PRODUCT_RANKS = 6


#: Groups drawn, cycled over the draws, by world size: the world; ranks 1..W-1 (group ranks
#: differ from global ranks); the even ranks (a group with a hole, created from its ranks in
#: descending order: ``new_group`` sorts them); and a singleton group of the last rank.
GROUPS = {2: ("world", "world", "world", "single"), 3: ("world", "sub", "evens", "single")}
#: Draws of a layout case (:data:`~conformance.cases.collective.ops.LAYOUT_OPS`): dtypes and
#: per-chunk sizes (channels_last: multiples of 6 of at least 12, see ``lay_out``).
LAYOUT_DTYPES = ("float32", "bfloat16", "int64")
LAYOUT_SIZES = {"noncontiguous": (1, 7, 33, 1025), "channels_last_input": (12, 30, 1026),
                "aliased_output": (1, 7, 33, 1025), "reused_input": (1, 7, 33, 1025, 65537)}
#: A ``reused_input`` draw's first pass takes the inputs of this draw index + the offset.
REUSE_OFFSET = 100_003


def drawn_groups(world_size: int, p2p: bool = False) -> tuple:
    """The names of :data:`GROUPS` drawn at ``world_size`` (``p2p``: without the singleton, a
    point-to-point op needs two group ranks)."""
    gs = GROUPS[min(world_size, 3)] if world_size >= 2 else ("world",)
    return tuple(g for g in gs if not (p2p and g == "single")) or ("world",)


def plan(op: str, world_size: int, profile: str = "dev") -> list[dict]:
    """The draws of ``op`` at ``world_size``: ``[{dtype, red, size, how, group}, ...]``.

    ``red`` is a ``torch.distributed.ReduceOp`` name or ``"-"``; ``group`` a name of
    :data:`GROUPS` (:func:`members` gives its global ranks). Every (dtype, reduction) pair once
    (without a reduction: each dtype as often as covers every size of
    :data:`~conformance.cases.collective.ops.SIZES`), sizes, completion modes and groups cycled.
    """
    o = OPS[op]
    combos = [(d, r) for d in DTYPES for r in (REDUCTIONS[d] if o.reduces else ("-",))]
    combos *= -(-len(SIZES) // len(combos))  # at least one draw per size
    groups = drawn_groups(world_size, o.p2p)
    out = []
    for k in range(len(combos) * REPEATS.get(profile, 1)):
        d, r = combos[k % len(combos)]
        # 7 is coprime to len(SIZES): consecutive draws walk every size
        draw = {"dtype": d, "red": r, "size": SIZES[(7 * k + len(op)) % len(SIZES)],
                "how": HOWS[k % len(HOWS)], "group": groups[(k // len(HOWS)) % len(groups)]}
        if o.rooted:  # every group rank is the root in turn (a backend reading it as a global rank shows)
            draw["root"] = (k // 2) % len(members(draw["group"], world_size))
        out.append(draw)
    if o.p2p and world_size < 2:
        return []
    return out


def plan_layout(layout: str, world_size: int, profile: str = "dev", only: str | None = None) -> list[dict]:
    """The draws of ``layout``: every op of ``LAYOUT_OPS[layout]`` (``only``: that op's draws of
    the same plan) with every dtype of :data:`LAYOUT_DTYPES` (reductions, sizes, completion modes
    and groups cycled); each draw names its ``op`` and ``layout``."""
    out, k = [], 0
    sizes = LAYOUT_SIZES[layout]
    for _ in range(REPEATS.get(profile, 1)):
        for op in LAYOUT_OPS[layout]:
            o = OPS[op]
            if o.p2p and world_size < 2:
                continue
            groups = drawn_groups(world_size, o.p2p)
            for d in LAYOUT_DTYPES:
                reds = REDUCTIONS[d] if o.reduces else ("-",)
                out.append({"op": op, "layout": layout, "dtype": d, "red": reds[k % len(reds)],
                            "size": sizes[k % len(sizes)], "how": HOWS[k % len(HOWS)],
                            "group": groups[(k // len(HOWS)) % len(groups)]})
                if o.rooted:
                    out[-1]["root"] = k % len(members(out[-1]["group"], world_size))
                k += 1
    return [d for d in out if only is None or d["op"] == only]


def members(group: str, world_size: int) -> list[int]:
    """Global ranks of a drawn group, in group-rank order (``new_group`` sorts them); ``pairs``
    (PJRT: XLA replica groups ``[[0, 1], [2, 3], ...]``): every rank, see :func:`subgroups`."""
    return {"pairs": list(range(world_size)), "world": list(range(world_size)), "sub": list(range(1, world_size)),
            "evens": list(range(0, world_size, 2)), "single": [world_size - 1]}[group]


def subgroups(group: str, world_size: int) -> list[list[int]]:
    """The groups a draw runs in, each judged on its own: one, or the pairs on PJRT."""
    if group == "pairs":
        return [[r, r + 1] for r in range(0, world_size - 1, 2)]
    return [members(group, world_size)]


def make_input(op: str, index: int, grank: int, n: int, draw: dict):
    """Group rank ``grank``'s input tensor (1-D, ``draw["dtype"]``) for draw ``index`` of ``op``.

    Values keep every exact result exact: small integers for integer sums, +-2^{-1,0,1} for
    products, full-range bits for bitwise reductions and copies; floats for copies include
    -0.0, inf and NaN (a copy must keep them).
    """
    import torch
    dtype, red = draw["dtype"], draw["red"]
    length = OPS[op].length(draw["size"], n, grank)
    # hash() of a str differs per process (PYTHONHASHSEED): a digest is the same everywhere
    g = torch.Generator().manual_seed(int.from_bytes(
        hashlib.sha256(f"{SEED}/{op}/{index}/{grank}".encode()).digest()[:7], "little"))
    tdt = getattr(torch, dtype)
    if dtype == "bool":
        return torch.randint(0, 2, (length,), generator=g).bool()
    if red == "PRODUCT":
        if grank >= PRODUCT_RANKS:
            return torch.ones(length, dtype=tdt)
        mag = torch.tensor([0.5, 1.0, 2.0]) if dtype in FLOATS else torch.tensor([1.0, 2.0])
        x = mag[torch.randint(0, len(mag), (length,), generator=g)]
        if dtype != "uint8":
            x = x * (torch.randint(0, 2, (length,), generator=g) * 2 - 1)
        return x.to(tdt)
    if dtype in INTS:
        info = torch.iinfo(tdt)
        if red == "SUM":  # no overflow in n terms
            hi = max(1, min(info.max, 2 ** 20) // n)
            lo = 0 if info.min == 0 else -hi
        else:
            lo, hi = info.min, info.max
        return torch.randint(lo, hi, (length,), generator=g, dtype=torch.int64).to(tdt)
    if dtype == "complex64":
        return torch.complex(torch.randn(length, generator=g), torch.randn(length, generator=g))
    x = torch.randn(length, generator=g, dtype=torch.float64)
    if red == "-" and length >= 4:  # special values a copy must keep bit for bit
        x[:3] = torch.tensor([-0.0, float("inf"), float("nan")], dtype=torch.float64)
    return x.to(tdt)


def label(op: str, draw: dict, world_size: int) -> str:
    """``all_reduce SUM bfloat16 [1023] (world of 3, future)``, ``all_gather float32 [7] noncontiguous
    (group [0, 2] of 3, sync)``: what a finding names."""
    op = draw.get("op", op)
    red = f" {draw['red']}" if draw["red"] != "-" else ""
    layout = f" {draw['layout']}" if draw.get("layout") else ""
    layout += f" root {draw['root']}" if draw.get("root") else ""
    group = (f"world of {world_size}" if draw["group"] == "world"
             else f"groups {subgroups('pairs', world_size)} of {world_size}" if draw["group"] == "pairs"
             else f"group {members(draw['group'], world_size)} of {world_size}")
    return f"{op}{red} {draw['dtype']} [{draw['size']}]{layout} ({group}, {draw['how']})"
