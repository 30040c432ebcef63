"""The ``collective`` kind: each collective of :mod:`conformance.cases.collective.ops` run on
the torch.distributed backend of the CPU world (``--backend``), rank by rank against the host
oracle.

A case is one op. Its draws (:func:`plan`) are deterministic: every (dtype, reduction) pair of
the ops table once (ops without a reduction: each dtype as often as covers every size), the sizes, the completion
modes (sync, ``Work.wait``, ``Work.get_future``) and the groups (the world; ranks 1..W-1 at
W >= 3) cycled over them. Every rank regenerates every group rank's input from the draw's seed,
runs the op and compares its own result with the oracle (:func:`compare`), returning only
findings and a digest of its result, so no tensor crosses the pipe. The judge turns them into
three checks:

* ``result``: every rank's result equals the oracle, bitwise where exact, within
  :func:`~conformance.cases.collective.ops.sum_bound` for floating SUM/AVG;
* ``agreement`` (ops whose ranks hold one result): every group rank's result bytes equal;
* ``coverage``: ``unsupported`` naming every (reduction, dtype) the backend rejected, with its
  message, else ``pass``; a rejection is never a failure.
"""
from __future__ import annotations

import copy
import hashlib

import numpy as np

from conformance.cases.collective.ops import (DTYPES, FLOATS, INTS, LAYOUT_OPS, OPS, REDUCTIONS, SIZES,
                                               UNIT_ROUNDOFF, lay_out, sum_bound)
from conformance.verdict import Verdict
from conformance.worlds.runtimes import RUNTIMES, runtime_class

#: Completion modes drawn: blocking call, ``async_op=True`` + ``Work.wait()``, + ``get_future().wait()``.
HOWS = ("sync", "wait", "future")
#: Draws per (dtype, reduction) pair, by profile (ops without a reduction take as many per
#: dtype as cover every size). dev: the default run, about 4.5 s for the family at W=2 and 3.
REPEATS = {"dev": 1, "ci": 1, "ci-pjrt": 1, "thorough": 4}
#: Seed of the inputs (a draw's inputs depend on it, the op, the draw index and the group rank).
SEED = 2027
#: Ranks at or above this hold 1 in a PRODUCT, so a product of 2^{+-1} factors stays exact in
#: every dtype (float16's largest finite value is 65504 < 2^16; int8 wraps above 127).
PRODUCT_RANKS = 6
#: Most findings one rank reports per draw, and most lines one verdict's diagnosis holds.
MAX_FINDINGS = 3
MAX_DIAGNOSIS_LINES = 40


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


def _groups(world_size: int, p2p: bool = False) -> tuple:
    gs = GROUPS[min(world_size, 3)] if world_size >= 2 else ("world",)
    return tuple(g for g in gs if not (p2p and g == "single")) or ("world",)


def plan(op: str, world_size: int, profile: str = "dev") -> list[dict]:
    """The draws of ``op`` at ``world_size``: ``[{dtype, red, size, how, group}, ...]``.

    ``red`` is a ``torch.distributed.ReduceOp`` name or ``"-"``; ``group`` a name of
    :data:`GROUPS` (:func:`members` gives its global ranks). Every size of
    :data:`~conformance.cases.collective.ops.SIZES` appears at least once for every op.
    """
    o = OPS[op]
    combos = [(d, r) for d in DTYPES for r in (REDUCTIONS[d] if o.reduces else ("-",))]
    combos *= -(-len(SIZES) // len(combos))  # at least one draw per size
    groups = _groups(world_size, o.p2p)
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
            groups = _groups(world_size, o.p2p)
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
    g = torch.Generator().manual_seed(_seed(op, index, grank))
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


def _seed(op: str, index: int, grank: int) -> int:
    # hash() of a str differs per process (PYTHONHASHSEED): a digest is the same everywhere
    return int.from_bytes(hashlib.sha256(f"{SEED}/{op}/{index}/{grank}".encode()).digest()[:7], "little")


def to_host(t) -> np.ndarray:
    """A result or input as the oracle's array: float64 / complex128 / int64 / bool numpy."""
    import torch
    if t.dtype == torch.bool:
        return t.numpy().copy()
    if t.is_complex():
        return t.to(torch.complex128).numpy()
    if t.is_floating_point():
        return t.double().numpy()
    return t.long().numpy()


def digest(t) -> str:
    """Digest of a result's bytes (replica agreement compares these)."""
    import torch
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))  # dense whatever the strides
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"").hexdigest()[:16]


def compare(got: np.ndarray, want: np.ndarray, bound: np.ndarray | None, dtype: str) -> list[dict]:
    """Elements where ``got`` differs from ``want``: ``[{element, got, expected, bound, ratio}]``,
    worst first (at most :data:`MAX_FINDINGS`), ``[]`` if none.

    ``bound`` None: exact (equal values; NaN matches NaN, -0.0 only -0.0); else
    ``|got - want| <= bound`` elementwise (complex: per component, named ``.re`` / ``.im``).
    A result of the wrong length is one finding at element -1.
    """
    if got.shape != want.shape:
        return [{"element": -1, "got": f"shape {list(got.shape)}", "expected": f"shape {list(want.shape)}",
                 "bound": None, "ratio": float("inf")}]
    if np.iscomplexobj(want):
        parts = []
        for part, f in ((".re", np.real), (".im", np.imag)):
            b = None if bound is None else bound[1 if part == ".im" else 0]
            for x in compare(f(got), f(want), b, "float32"):
                x["element"] = f"{x['element']}{part}"
                parts.append(x)
        return sorted(parts, key=lambda x: -x["ratio"])[:MAX_FINDINGS]
    if bound is None:
        if want.dtype.kind == "f":
            same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
        else:
            same = got == want
        bad = np.flatnonzero(~same)
        return [{"element": int(i), "got": _num(got[i]), "expected": _num(want[i]), "bound": None,
                 "ratio": float("inf")} for i in bad[:MAX_FINDINGS]]
    with np.errstate(invalid="ignore"):
        dev = np.abs(got - want)
        ratio = np.where(dev == 0, 0.0, dev / np.where(bound > 0, bound, np.finfo(np.float64).tiny))
    ratio = np.where(np.isnan(ratio), np.inf, ratio)
    bad = np.flatnonzero(ratio > 1)
    worst = bad[np.argsort(-ratio[bad], kind="stable")][:MAX_FINDINGS]
    return [{"element": int(i), "got": _num(got[i]), "expected": _num(want[i]), "bound": float(bound[i]),
             "ratio": float(ratio[i])} for i in worst]


def _num(v):
    return bool(v) if isinstance(v, (bool, np.bool_)) else (int(v) if np.issubdtype(type(v), np.integer)
                                                           else float(v))


def worst_ratio(got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> tuple[float, float, float]:
    """``(deviation, bound, deviation / bound)`` at the element of largest ratio (bounded results)."""
    if np.iscomplexobj(want):
        got, want = np.concatenate([got.real, got.imag]), np.concatenate([want.real, want.imag])
        bound = np.concatenate(bound)
    if want.size == 0:
        return 0.0, 0.0, 0.0
    dev = np.abs(got - want)
    ratio = dev / np.where(bound > 0, bound, np.finfo(np.float64).tiny)
    i = int(np.nanargmax(ratio)) if np.isfinite(ratio).any() else 0
    return float(dev[i]), float(bound[i]), float(ratio[i])


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


# --- replica side ---------------------------------------------------------------------

_GROUPS: dict = {}
#: What a backend raises to refuse a call (a dtype, a reduction, a completion mode, subgroups).
REFUSALS = (RuntimeError, ValueError, TypeError, NotImplementedError)


def _refusal(exc) -> str:
    """``<Type>: <first line of the message>`` (at most 200 characters of it)."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def _group(dist, name: str, world_size: int):
    """The process group of a drawn group name, created once per process (every rank calls
    ``new_group`` in the same order, as torch requires); ``None`` is the default group."""
    if name == "world":
        return None
    key = (name, world_size, id(dist.group.WORLD))  # a new default group: new subgroups
    if key not in _GROUPS:
        try:
            _GROUPS[key] = dist.new_group(sorted(members(name, world_size), reverse=True))
        except REFUSALS as exc:
            _GROUPS[key] = exc  # a backend without subgroups: its draws are rejected, once
    if isinstance(_GROUPS[key], Exception):
        raise _GROUPS[key]
    return _GROUPS[key]


def task_collective(ctx, op: str, draws: list) -> list:
    """World task: run ``op`` for every draw on this rank; one entry per draw:
    ``None`` (not a member of the draw's group), ``{"raised": "<Type>: <message>"}`` (the backend
    rejected the call) or ``{"digest", "findings", "dev", "bound", "ratio"}`` (``digest`` None
    where the op defines no result on this rank; ``dev``/``bound``/``ratio`` at the worst
    element of a bounded result, else None)."""
    import torch.distributed as dist
    out = []
    for i, d in enumerate(draws):
        op_i = d.get("op", op)
        o = OPS[op_i]
        ranks = members(d["group"], ctx.world_size)
        try:
            g = _group(dist, d["group"], ctx.world_size)  # before the membership test: every rank creates it
        except REFUSALS as exc:
            out.append({"raised": "new_group: " + _refusal(exc)} if ctx.rank in ranks else None)
            continue
        if ctx.rank not in ranks:
            out.append(None)
            continue
        n, me = len(ranks), ranks.index(ctx.rank)
        xs = [make_input(op_i, i, j, n, d) for j in range(n)]
        ctx.note(phase=label(op, d, ctx.world_size))
        c = {"dist": dist, "how": d["how"], "red": d["red"], "grank": me, "n": n, "size": d["size"],
             "layout": d.get("layout"), "root": d.get("root", 0)}
        try:
            t = lay_out(xs[me].clone(), d.get("layout"))
            if d.get("layout") == "reused_input":  # the same tensor object, other values, first
                t.copy_(make_input(op_i, i + REUSE_OFFSET, me, n, d))
                o.replica(t, g, c)
                t.copy_(xs[me])
            res = o.replica(t, g, c)
        except REFUSALS as exc:  # the backend's refusal: on every rank before any traffic (gloo checks locally)
            out.append({"raised": _refusal(exc)})
            continue
        host = [to_host(x) for x in xs]
        want = o.oracle(host, me, d["red"], d["size"], root=d["root"]) if "root" in d else \
            o.oracle(host, me, d["red"], d["size"])
        if res is None or want is None:
            out.append({"digest": None, "findings": [], "dev": None, "bound": None, "ratio": None})
            continue
        res = res.reshape(-1)  # logical order, whatever the layout
        bound = _bound(o, host, d, want, me)
        got = to_host(res)
        entry = {"digest": digest(res), "findings": compare(got, want, bound, d["dtype"]),
                 "dev": None, "bound": None, "ratio": None}
        if bound is not None and got.shape == want.shape:
            entry["dev"], entry["bound"], entry["ratio"] = worst_ratio(got, want, bound)
        out.append(entry)
    return out


def _bound(o, host, d, want, me):
    """The elementwise bound of a floating SUM/AVG result, or None (exact); reduce_scatter:
    the bound of group rank ``me``'s chunk. complex: ``(real bound, imaginary bound)``."""
    if not o.reduces or d["red"] not in ("SUM", "AVG") or d["dtype"] not in UNIT_ROUNDOFF:
        return None

    def one(xs):
        b = sum_bound(xs, d["red"], d["dtype"])
        k = want.shape[0]
        return b if b.shape[0] == k else b[me * k:(me + 1) * k]  # the oracle's chunk of the sum
    if d["dtype"] == "complex64":
        return one([x.real for x in host]), one([x.imag for x in host])
    return one(host)


# --- judge ------------------------------------------------------------------------------

def judge(case, draws: list, results: list, world_size: int, runtime: str = "cpu") -> list[Verdict]:
    """Verdicts of one op's ``draws`` from every rank's :func:`task_collective` list (by global
    rank), one per ``case.checks`` entry, in that order. A draw over several groups (``pairs``)
    judges each group on its own."""
    op = case.args.get("op")  # None in a layout case: each draw names its op
    fails, disagree, rejected, ran, ran_ok = [], [], {}, 0, set()
    worst = [0.0, 0.0, 0.0, None]  # dev, bound, ratio, rank
    for i, d in enumerate(draws):
        all_ranks = members(d["group"], world_size)
        entries = {r: results[r][i] for r in all_ranks}
        raised = {r: e["raised"] for r, e in entries.items() if "raised" in e}
        if raised:
            if len(raised) == len(all_ranks) and len(set(raised.values())) == 1:
                rejected.setdefault(next(iter(raised.values())), []).append(d)
                continue
            said = "; ".join(f"rank {r} raised {m}" for r, m in raised.items())
            fails.append((float("inf"), f"{label(op, d, world_size)}: {said}; ranks {sorted(set(all_ranks) - set(raised))} "
                          "did not", None, None))
            continue
        ran += 1
        ran_ok.add(_pair(d))
        for ranks in subgroups(d["group"], world_size):
            _judge_group(op, d, world_size, ranks, {r: entries[r] for r in ranks}, fails, disagree, worst)
    worst = tuple(worst)
    # worst first (a bitwise mismatch or a one-sided refusal counts as infinitely far): the reason
    # names the finding the verdict's max dev / bound are taken at when it is a bounded one
    wrong_ops = {x[1].split(" ", 1)[0] for x in fails}
    fails.sort(key=lambda x: -x[0])
    top = fails[0] if fails else None
    fails = [x[1] for x in fails]
    out = []
    for check in case.checks:
        v = Verdict(case.name, check, "", runtime, "-", world_size, "pass")
        if check == "result":
            if ran == 0 and rejected and not fails:
                v.status, v.reason = "unsupported", "the backend rejected every draw: " + _rejections(rejected, ran_ok)
            elif ran == 0 and not fails:
                v.status, v.reason = "vacuous", "no draw ran"
            elif fails:
                v.status, v.reason = "fail", _first(fails)
                if wrong_ops and op is None:  # a layout case: which ops, then the worst finding
                    v.reason = f"wrong in {', '.join(sorted(wrong_ops))}: {v.reason}"
            else:
                v.reason = f"{ran} draw(s) equal to the host oracle"
            if top is not None and top[2] is not None:  # the named finding: its deviation and bound
                (v.max_dev, v.atol), v.replica = top[2], top[3]
                v.margin = v.atol / v.max_dev if v.max_dev else 0.0
            elif top is not None:
                v.replica = top[3]
            elif worst[3] is not None:  # a pass: the worst element of the bounded draws
                v.max_dev, v.atol = worst[0], worst[1]
                v.margin = (worst[1] / worst[0]) if worst[0] else float("inf")
            v.diagnosis = "\n".join(fails[:MAX_DIAGNOSIS_LINES])
        elif check == "agreement":
            if disagree:
                v.status, v.reason, v.diagnosis = "fail", _first(disagree), "\n".join(disagree[:MAX_DIAGNOSIS_LINES])
            elif ran == 0:
                v.status, v.reason = "unsupported", "no draw ran"
            else:
                v.reason = f"every group rank holds the same bits in {ran} draw(s)"
        elif check == "coverage":
            if rejected:
                v.status, v.reason = "unsupported", "the backend rejects " + _rejections(rejected, ran_ok)
            else:
                v.reason = f"the backend ran all {len(draws)} draw(s)"
        out.append(v)
    return out


def _judge_group(op, d, world_size, ranks, entries, fails, disagree, worst):
    """One group's findings of draw ``d`` into ``fails`` / ``disagree``; ``worst`` (a list)
    updated in place."""
    for r, e in entries.items():
        for f in e["findings"]:
            fails.append((f["ratio"], f"{label(op, d, world_size)}: rank {r} element {f['element']} = {_fmt(f['got'])}, "
                          f"expected {_fmt(f['expected'])}" + (f" ± {f['bound']:.3g}" if f["bound"] is not None
                                                               else " (bitwise)"), _dev(f), r))
        if e["ratio"] is not None and e["ratio"] > worst[2]:
            worst[:] = [e["dev"], e["bound"], e["ratio"], r]
    if OPS[d.get("op", op)].agree:
        digests = {r: e["digest"] for r, e in entries.items()}
        if len(set(digests.values())) > 1:
            ref = digests[ranks[0]]
            disagree.append(f"{label(op, d, world_size)}: rank(s) {[r for r, h in digests.items() if h != ref]} hold "
                            f"other bits than rank {ranks[0]}")


def _dev(f) -> tuple | None:
    """``(deviation, bound)`` of a finding (bound 0 for a bitwise one), None if not numeric."""
    got, want = f["got"], f["expected"]
    if isinstance(got, bool) or isinstance(want, bool):
        got, want = int(got), int(want)
    if not all(isinstance(x, (int, float)) for x in (got, want)):
        return None
    dev = abs(float(got) - float(want))
    return (dev if np.isfinite(dev) else float("inf")), (f["bound"] or 0.0)


def _fmt(x):
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _first(lines):
    return lines[0] + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")


def _pair(d) -> tuple:
    """What a rejection names: ``(reduction, dtype)``, prefixed with the op in a layout case."""
    return ((d["op"] + " " + d["red"]) if d.get("op") and d["red"] != "-" else d.get("op", d["red"]), d["dtype"])


def _rejections(rejected: dict, ran_ok: set = frozenset()) -> str:
    """``AVG float16, float32 ...: RuntimeError: ...; ...`` from ``{message: [draws]}``; a
    (reduction, dtype) that ran in another completion mode is named with the refused mode(s)."""
    parts = []
    for msg, ds in rejected.items():
        what = {}
        for d in ds:
            key = _pair(d)
            what.setdefault(key, set()).add(d["how"])
        names = sorted((f"{r} " if r != "-" else "") + t + (f" via {'/'.join(sorted(hows))}" if (r, t) in ran_ok
                                                           else "") for (r, t), hows in what.items())
        parts.append(f"{', '.join(names)} ({msg})")
    return "; ".join(parts)


def evaluate_collective(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``collective`` row (the implementation is not involved: the verdicts of one
    (runtime, W) are computed once per session and repeated for every implementation)."""
    if runtime not in RUNTIMES or not runtime_class(runtime).collectives_judged:
        return [Verdict(case.name, c, impl, runtime, "-", w, "skip",
                        reason=f"the collective family runs on the CPU runtime (torch.distributed) and on "
                        f"PJRT (torch_xla); {runtime}'s collectives are not judged op by op yet") for c in case.checks]
    profile = session.settings.profile
    key = ("collective", case.name, runtime, w, profile)
    if key not in session._cache:
        op, layout = case.args.get("op"), case.args.get("layout")
        draws = plan_layout(layout, w, profile, op) if layout else plan(op, w, profile)
        results = session.run(runtime, w, task_collective, timeout=case.timeout, op=op, draws=draws)
        if results is None:
            return None
        session._cache[key] = judge(case, draws, results, w) if draws else [
            Verdict(case.name, c, impl, runtime, "-", w, "vacuous", reason="no draws") for c in case.checks]
    return [copy.copy(v) for v in session._cache[key]]
