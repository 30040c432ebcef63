"""The ``collective`` kind: each collective of :mod:`conformance.cases.collective.ops` run on
the torch.distributed backend of the CPU world (``--backend``), rank by rank against the host
oracle. Every rank runs the op's draws and compares its own result with the oracle
(:func:`compare`), returning only findings and a digest of its result. The judge turns them into
three checks:

* ``result``: every rank's result equals the oracle, bitwise where exact, within
  :func:`~conformance.cases.collective.ops.sum_bound` for floating SUM/AVG;
* ``agreement`` (ops whose ranks hold one result): every group rank's result bytes equal;
* ``coverage``: ``unsupported`` naming every (reduction, dtype) the backend rejected, with its
  message, else ``pass``; a rejection is never a failure.
"""
from __future__ import annotations

import hashlib

import numpy as np

from conformance.cases.collective.draws import REUSE_OFFSET, label, make_input, members, plan, plan_layout, subgroups
from conformance.cases.collective.ops import OPS, lay_out, sum_bound
from conformance.cases.shared.numerics import UNIT_ROUNDOFF
from conformance.verdict import Verdict
from conformance.worlds.runtimes import RUNTIMES, runtime_class

#: Most findings one rank reports per draw, and most lines one verdict's diagnosis holds.
MAX_FINDINGS = 3
MAX_DIAGNOSIS_LINES = 40


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
    worst first (at most :data:`MAX_FINDINGS`). ``bound`` None: exact (NaN matches NaN, -0.0 only
    -0.0); else ``|got - want| <= bound`` elementwise (complex: per component, ``.re`` / ``.im``).
    A result of the wrong length is one finding at element -1."""
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


# --- replica side ---------------------------------------------------------------------

_GROUPS: dict = {}
#: What a backend raises to refuse a call (a dtype, a reduction, a completion mode, subgroups).
REFUSALS = (RuntimeError, ValueError, TypeError, NotImplementedError)


def refusal(exc) -> str:
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
            out.append({"raised": "new_group: " + refusal(exc)} if ctx.rank in ranks else None)
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
            out.append({"raised": refusal(exc)})
            continue
        out.append(judged_entry(o, xs, d, me, res))
    return out


def judged_entry(o, xs: list, d: dict, me: int, res) -> dict:
    """Group rank ``me``'s entry of draw ``d`` that ran on the group's inputs ``xs``: its result
    ``res`` (on the host; None where the op defines none) against the oracle, as
    :func:`task_collective` returns it."""
    host = [to_host(x) for x in xs]
    want = o.oracle(host, me, d["red"], d["size"], root=d["root"]) if "root" in d else \
        o.oracle(host, me, d["red"], d["size"])
    if res is None or want is None:
        return {"digest": None, "findings": [], "dev": None, "bound": None, "ratio": None}
    res = res.reshape(-1)  # logical order, whatever the layout
    bound = result_bound(o, host, d, want, me)
    got = to_host(res)
    entry = {"digest": digest(res), "findings": compare(got, want, bound, d["dtype"]),
             "dev": None, "bound": None, "ratio": None}
    if bound is not None and got.shape == want.shape:
        entry["dev"], entry["bound"], entry["ratio"] = worst_ratio(got, want, bound)
    return entry


def result_bound(o, host, d, want, me):
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
    """One verdict per ``case.checks`` entry from every rank's :func:`task_collective` list of
    ``draws`` (by global rank); a draw over several groups (``pairs``) judges each on its own."""
    op = case.args.get("op")  # None in a layout case: each draw names its op
    seen = _findings(op, draws, results, world_size)
    out = []
    for check in case.checks:
        v = Verdict(case.name, check, "", runtime, "-", world_size, "pass")
        if check == "result":
            _judge_result(v, op, seen)
        elif check == "agreement":
            if seen["disagree"]:
                v.status, v.reason = "fail", _first(seen["disagree"])
                v.diagnosis = "\n".join(seen["disagree"][:MAX_DIAGNOSIS_LINES])
            elif seen["ran"] == 0:
                v.status, v.reason = "unsupported", "no draw ran"
            else:
                v.reason = f"every group rank holds the same bits in {seen['ran']} draw(s)"
        elif check == "coverage":
            if seen["rejected"]:
                v.status = "unsupported"
                v.reason = "the backend rejects " + _rejections(seen["rejected"], seen["ran_ok"])
            else:
                v.reason = f"the backend ran all {len(draws)} draw(s)"
        out.append(v)
    return out


def _findings(op, draws: list, results: list, world_size: int) -> dict:
    """What the ranks reported over ``draws``: ``fails`` (lines, worst first; ``top`` the worst
    as ``(ratio, line, (dev, bound) or None, rank)``), ``disagree`` (lines), ``rejected``
    (``{message: [draws]}`` refused alike on every rank), ``ran`` / ``ran_ok`` (draws that ran,
    and their :func:`_pair`), ``wrong_ops`` and ``worst`` (``(dev, bound, ratio, rank)`` of the
    bounded draws)."""
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
    # worst first (a bitwise mismatch or a one-sided refusal counts as infinitely far): the reason
    # names the finding the verdict's max dev / bound are taken at when it is a bounded one
    wrong_ops = {x[1].split(" ", 1)[0] for x in fails}
    fails.sort(key=lambda x: -x[0])
    return {"fails": [x[1] for x in fails], "top": fails[0] if fails else None, "disagree": disagree,
            "rejected": rejected, "ran": ran, "ran_ok": ran_ok, "wrong_ops": wrong_ops, "worst": tuple(worst)}


def _judge_result(v: Verdict, op, seen: dict) -> None:
    """The ``result`` check of :func:`judge` into ``v``, from :func:`_findings` ``seen``."""
    fails, top, worst, ran, rejected = seen["fails"], seen["top"], seen["worst"], seen["ran"], seen["rejected"]
    if ran == 0 and rejected and not fails:
        v.status, v.reason = "unsupported", "the backend rejected every draw: " + _rejections(rejected, seen["ran_ok"])
    elif ran == 0 and not fails:
        v.status, v.reason = "vacuous", "no draw ran"
    elif fails:
        v.status, v.reason = "fail", _first(fails)
        if seen["wrong_ops"] and op is None:  # a layout case: which ops, then the worst finding
            v.reason = f"wrong in {', '.join(sorted(seen['wrong_ops']))}: {v.reason}"
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


def _judge_group(op, d, world_size, ranks, entries, fails, disagree, worst):
    """One group's findings of draw ``d`` into ``fails``, ``disagree`` and ``worst`` (in place)."""
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
            what.setdefault(_pair(d), set()).add(d["how"])
        names = sorted((f"{r} " if r != "-" else "") + t + (f" via {'/'.join(sorted(hows))}" if (r, t) in ran_ok
                                                           else "") for (r, t), hows in what.items())
        parts.append(f"{', '.join(names)} ({msg})")
    return "; ".join(parts)


def evaluate_collective(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``collective`` row, computed once per session (:mod:`.kind`)."""
    if runtime not in RUNTIMES or not runtime_class(runtime).collectives_judged:
        return every_check(case, impl, runtime, w, "skip", f"the collective family runs on the CPU runtime "
                           f"(torch.distributed) and on PJRT (torch_xla); {runtime}'s collectives are not judged "
                           "op by op yet")
    profile = session.settings.profile
    key = ("collective", case.name, runtime, w, profile)

    def verdicts():
        op, layout = case.args.get("op"), case.args.get("layout")
        draws = plan_layout(layout, w, profile, op) if layout else plan(op, w, profile)
        results = session.run(runtime, w, task_collective, timeout=case.timeout, op=op, draws=draws)
        if results is None:
            return None
        return judge(case, draws, results, w) if draws else every_check(case, impl, runtime, w, "vacuous", "no draws")
    return session.memo(key, verdicts)


def every_check(case, impl, runtime, w, status: str, reason: str) -> list[Verdict]:
    """One verdict per check of ``case``, each ``status`` with ``reason`` (no draw judged)."""
    return [Verdict(case.name, c, impl, runtime, "-", w, status, reason=reason) for c in case.checks]
