"""The check table: comparisons of every replica's trajectory with the single-device reference
(or with replica 0's, for ``agreement``), each giving a :class:`~conformance.verdict.Verdict`.
``vacuous`` replaces ``pass`` when the comparison could not have failed: world size < 2, or the
reference moved less than ``VACUITY_FACTOR * atol`` over the run (the lr=1e-100 trap).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from conformance.tolerances import MIN_WORLD_SIZE, VACUITY_FACTOR, Tolerance
from conformance.verdict import Verdict


@dataclass(frozen=True)
class Check:
    """One row of the check table.

    ``series(replicas, ref) -> (actual [R, S, N], expected [S, N] or [R, S, N])``
    picks the compared quantity; ``applies(model_spec, run_spec)`` says whether
    the check is meaningful for a run; ``tol(t) -> (atol, rtol)``;
    ``movement(ref) -> float`` the vacuity measure (default: parameter movement);
    ``layout(replicas) -> [(name, shape), ...]`` the tensors behind the ``N``
    values (a failure names them; ``None``: flat indices only); ``when``: what
    the series axis ``S`` is - ``steps`` (entry ``i`` is after step ``i + 1``),
    ``final`` (the state after the last step) or ``once`` (one observation, no
    step); ``nan_is_absent``: NaN on both sides means "absent" (a ``None``
    gradient) and compares equal - elsewhere a NaN is always a failure;
    ``absent(replicas) -> bool [R, S, N] or None``: where the replicas' values are
    absent (a ``None`` gradient read as NaN), so a failure says "has no gradient"
    there, not "has NaN" (with ``nan_is_absent`` a reference NaN is absent too).
    """

    name: str
    description: str
    series: Callable
    tol: Callable
    applies: Callable = lambda model, run: True
    movement: Callable = None
    layout: Callable = None
    when: str = "steps"
    nan_is_absent: bool = False
    absent: Callable = None


def named(key: str) -> Callable:
    """``layout`` of a check on the replicas' ``layout[key]`` (see ``conformance.cases.shared.loop.train_replica``)."""
    return lambda reps: ((reps[0].get("layout") or {}).get(key)
                         if reps and isinstance(reps[0], dict) else None)


def movement(ref: dict) -> float:
    """Max over elements of |theta_K - theta_0| in the reference run."""
    return float(np.max(np.abs(ref["params"][-1].astype(np.float64) - ref["params"][0])))


def buffer_movement(ref: dict) -> float:
    """Max over elements of |buffer_K - buffer_0| of rank 0 in the reference run."""
    b = ref["buffers"]
    return float(np.max(np.abs(b[-1, 0] - b[0, 0]))) if b.shape[-1] else 0.0


def _pad(v, n: int) -> np.ndarray:
    """1-D ``v`` NaN-padded to length ``n`` (left as is when longer: the judge then fails on the shape)."""
    v = np.asarray(v, dtype=np.float64)
    return np.concatenate([v, np.full(n - v.size, np.nan)]) if v.size < n else v


CHECKS = {c.name: c for c in [
    Check("param_parity", "every parameter of every replica equals the single-device "
          "reference after every step", lambda reps, ref: (np.stack([r["params"][1:] for r in reps]),
                                                           ref["params"][1:]),
          lambda t: (t.atol, t.rtol), layout=named("params")),
    Check("loss_parity", "the replica-averaged loss equals the reference loss at every step",
          # the loss the DDP minimises is the mean of the replicas' local losses
          lambda reps, ref: (np.mean([r["losses"] for r in reps], axis=0)[None, :, None], ref["losses"][:, None]),
          lambda t: (t.loss_atol, 0.0), layout=lambda reps: [("loss", ())]),
    Check("buffer_parity", "every replica's buffers equal what upstream DDP semantics give "
          "(rank 0's broadcast before forward, then a local update) after every step",
          lambda reps, ref: (np.stack([r["buffers"][1:] for r in reps]),
                             np.stack([ref["buffers"][1:, r] for r in range(len(reps))])),
          lambda t: (t.atol, t.rtol), applies=lambda m, run: m.batch_coupled,
          movement=buffer_movement, layout=named("buffers")),
    Check("optimizer_state", "every replica's final optimizer state (momentum buffers) equals "
          "the reference's", lambda reps, ref: (np.stack([r["optim"][None] for r in reps]), ref["optim"][None]),
          lambda t: (t.atol, t.rtol), applies=lambda m, run: run.momentum > 0,
          layout=named("optim"), when="final"),
    Check("eval_parity", "every replica's outputs of its forwards without backward (evaluation under "
          "no_grad / inference_mode, a target forward before a backward) equal the reference's",
          # each replica's own length (uneven local batches): NaN-padded to the reference's, read as absent
          lambda reps, ref: (np.stack([_pad(r["evals"], ref["evals"].shape[-1])[None] for r in reps]),
                             ref["evals"][:len(reps), None]),
          lambda t: (t.atol, t.rtol), applies=lambda m, run: False,  # the loop programs' (SCENARIO_CHECKS):
          layout=named("evals"), when="final", nan_is_absent=True),  # a training case has no such forward
]}

#: Names of the replica-agreement check (:func:`judge_agreement`) and of the transparency check
#: (:func:`conformance.cases.shared.transparency.judge_transparency`).
AGREEMENT, TRANSPARENCY = "agreement", "transparency"
#: Checks with no deviation to bound: calibration and measured tolerances leave them out.
UNBOUNDED = (AGREEMENT, TRANSPARENCY)
#: The checks of a scenario case, in order: its check name -> the row of :data:`CHECKS` that
#: judges it (or the agreement or transparency check).
SCENARIO_CHECKS = {"params": "param_parity", "buffers": "buffer_parity", "optimizer_state": "optimizer_state",
                   "eval_outputs": "eval_parity", AGREEMENT: AGREEMENT, TRANSPARENCY: TRANSPARENCY}
#: The scenario checks only a loop program exercises (its forwards without backward).
LOOP_ONLY_CHECKS = ("eval_outputs",)


def scenario_checks(loop: bool) -> tuple:
    """The checks of a scenario case: :data:`SCENARIO_CHECKS`, without :data:`LOOP_ONLY_CHECKS`
    where the case draws no loop program."""
    return tuple(c for c in SCENARIO_CHECKS if loop or c not in LOOP_ONLY_CHECKS)


class Names:
    """Where a flat index of a compared vector lives: tensor name, shape, index inside it.
    ``layout`` is ``[(name, shape), ...]`` in the vector's order, an entry maybe ``(name, shape,
    corner)`` (:func:`conformance.cases.shared.readback.corner`, shown after the name); one that
    does not cover exactly ``n`` values (or ``None``) names flat indices only."""

    MAX_LISTED = 3  # tensor names a reason lists before "+k more"

    def __init__(self, layout, n: int):
        sizes = [int(np.prod(entry[1], dtype=np.int64)) for entry in layout or ()]
        self.named = bool(layout) and sum(sizes) == n
        if not self.named:
            layout, sizes = [("", (n,))], [n]
        self.names = [f"'{e[0]}' ({e[2]})" if len(e) > 2 and e[2] else f"'{e[0]}'" for e in layout]
        self.shapes = [tuple(e[1]) for e in layout]
        self.ends = np.cumsum(sizes, dtype=np.int64)
        self.starts = self.ends - np.asarray(sizes, dtype=np.int64)

    def tensors(self, idx):
        """Tensor number of each flat index in ``idx``."""
        return np.searchsorted(self.ends, idx, side="right")

    def entry(self, i: int) -> str:
        """``'bias' [10] at flat index 3`` (``element 3`` when unnamed)."""
        t = int(self.tensors(i))
        if not self.named:
            return f"element {i}"
        if self.shapes[t] == ():
            return self.names[t]
        return f"{self.names[t]} {list(self.shapes[t])} at flat index {i - int(self.starts[t])}"

    def label(self, t: int) -> str:
        if not self.named:
            return "the flat vector"
        return self.names[t] + (f" {list(self.shapes[t])}" if self.shapes[t] else "")

    def census(self, mask) -> tuple[str, list]:
        """(``1 of 2 tensors (10 of 110 values)``, tensor numbers) of the ``True`` values of ``mask``."""
        idx = np.flatnonzero(mask)
        ts = [int(t) for t in np.unique(self.tensors(idx))]
        values = f"{len(idx)} of {mask.size} values"
        if not self.named:
            return values, ts
        return f"{len(ts)} of {len(self.names)} tensors ({values})", ts

    def listing(self, ts) -> str:
        shown = ", ".join(self.names[t] for t in ts[:self.MAX_LISTED])
        return shown + (f" (+{len(ts) - self.MAX_LISTED} more)" if len(ts) > self.MAX_LISTED else "")


def nonfinite(x: float) -> str:
    return "NaN" if np.isnan(x) else ("+Inf" if x > 0 else "-Inf")


def _when(check: Check, ref: dict):
    """``(step of series index i or None, phrase 'from step 3', heading 'At step 3')``."""
    if check.when == "once":
        return (lambda i: None), (lambda i: ""), (lambda i: "In all")
    if check.when == "final":
        last = ref["params"].shape[0] - 1 if isinstance(ref, dict) and "params" in ref else None
        after = f" (after step {last})" if last else ""
        return (lambda i: last), (lambda i: "in the final state" + after), (lambda i: "In the final state")
    return (lambda i: i + 1), (lambda i: f"from step {i + 1}"), (lambda i: f"At step {i + 1}")


def _missing(x: float, absent: bool) -> str:
    return "none (None)" if absent else nonfinite(x)


def _deviation(names, actual, expected, diff, bound, bad, step_of, step_at, heading, multi,
               absent=None, ref_absent=False):
    """``(reason, diagnosis)`` of a failed comparison with the reference: the first
    bad step's first deviating replica, its worst value named, how much is out of
    bound, where NaN/Inf start; the diagnosis lists every out-of-bound tensor."""
    bad_steps = np.flatnonzero(bad.any(axis=(0, 2)))
    s = int(bad_steps[0])
    reps = [int(r) for r in np.flatnonzero(bad[:, s].any(axis=1))]
    r = reps[0]
    dev = np.where(np.isnan(diff[r, s]), np.inf, diff[r, s])
    worst = int(np.argmax(np.where(bad[r, s], dev, -1.0)))
    a, e = actual[r, s, worst], expected[r, s, worst]
    where = (" " + step_at(s)) if step_at(s) else ""
    entry = names.entry(worst)
    a_none = absent is not None and bool(absent[r, s, worst])
    e_none = ref_absent and bool(np.isnan(e))
    if a_none:
        first = (f"replica {r}'s {entry}" if multi else entry) + f" is missing (None: no gradient){where}"
        first += f" where the reference has {_missing(e, e_none) if not np.isfinite(e) else f'{e:.3g}'}"
    elif not np.isfinite(a):
        first = (f"replica {r} has {nonfinite(a)} in {entry}" if multi else f"{entry} is {nonfinite(a)}") + where
        if not np.isfinite(e):
            first += f" (the reference has {_missing(e, e_none)} there)"
    else:
        first = (f"replica {r}'s {entry}" if multi else entry)
        first += (f" is {a:.3g}{where} where the reference has {_missing(e, e_none)}" if not np.isfinite(e) else
                  f" deviates from the reference by {dev[worst]:.3g}{where} (bound there {bound[r, s, worst]:.3g})")
    census, ts = names.census(bad[r, s])
    none_here = absent[r, s] & bad[r, s] if absent is not None else np.zeros_like(bad[r, s])
    nan_here = int((~np.isfinite(actual[r, s]) & bad[r, s] & ~none_here).sum())
    parts = [first + "."]
    if bad.shape[2] > 1:  # one scalar (the loss) needs no census
        parts.append(f"{heading(s)}{f', replica {r}' if multi else ''}: {census} out of bound"
                     + (f" ({int(none_here.sum())} of them None)" if none_here.any() else "")
                     + (f" ({nan_here} of them NaN/Inf)" if nan_here else "")
                     + (f": {names.listing(ts)}" if names.named else "") + ".")
    if len(reps) > 1:
        parts.append(f"Replicas {', '.join(map(str, reps))} are out of bound there.")
    nan_bad = ~np.isfinite(actual) & bad & (~absent if absent is not None else True)
    if nan_bad.any() and np.isfinite(a) and not a_none:  # NaN/Inf starting later: say so
        sn = int(np.flatnonzero(nan_bad.any(axis=(0, 2)))[0])
        rn = int(np.flatnonzero(nan_bad[:, sn].any(axis=1))[0])
        en = int(np.flatnonzero(nan_bad[rn, sn])[0])
        wn = (" " + step_at(sn)) if step_at(sn) else ""
        parts.append((f"Replica {rn} has {nonfinite(actual[rn, sn, en])} in {names.entry(en)}" if multi
                      else f"{names.entry(en)} is {nonfinite(actual[rn, sn, en])}") + wn + ".")
    if bad.shape[1] > 1:
        parts.append(f"Over the run: {int(bad.sum())} value(s) out of bound in {len(bad_steps)} of "
                     f"{bad.shape[1]} step(s).")
    return " ".join(parts), _tensor_table(names, diff, bad, step_of, step_at, multi, absent)


def _tensor_table(names, diff, bad, step_of, step_at, multi, absent=None, limit=40):
    """Per replica, every tensor out of bound: from when, how many values there, worst deviation."""
    lines = ["out of bound, per replica and tensor (first bad step: values out of bound there; "
             "worst deviation over the run):"]
    for r in range(bad.shape[0]):
        if not bad[r].any():
            continue
        rows = []
        for t in range(len(names.names)):
            sl = slice(int(names.starts[t]), int(names.ends[t]))
            b = bad[r, :, sl]
            if not b.any():
                continue
            s = int(np.flatnonzero(b.any(axis=1))[0])
            d = np.where(np.isnan(diff[r, :, sl]), np.inf, diff[r, :, sl])
            d = np.where(b, d, -1.0)
            k = int(np.argmax(d))
            when, at = step_at(s), step_of(k // b.shape[1])
            none = absent is not None and bool(absent[r, :, sl].flat[k])
            rows.append((s, -d.flat[k], f"    {names.label(t)}: {when + ': ' if when else ''}"
                         f"{int(b[s].sum())} of {b.shape[1]} values, "
                         + ("missing (None)" if none else f"worst {d.flat[k]:.3g}"
                            + (f" at flat index {k % b.shape[1]}" if b.shape[1] > 1 else ""))
                         + (f" (step {at})" if at is not None else "")))
        rows.sort(key=lambda x: x[:2])
        lines.append(f"  replica {r}:" if multi else "  the run:")
        lines += [x[2] for x in rows[:limit]]
        if len(rows) > limit:
            lines.append(f"    ... {len(rows) - limit} more tensor(s)")
    return "\n".join(lines)


def margin(dev: float, bound: float) -> float:
    """``bound / dev`` (>= 1 within the bound; NaN when ``dev`` is NaN: nothing measured)."""
    if dev != dev:
        return float("nan")
    return bound / dev if dev > 0 else float("inf")


def worst_element(diff, bound) -> tuple[float, float, list]:
    """``(deviation, bound, per_step)`` at the worst element of ``diff`` ``[R, S, N]`` held to the
    per-element ``bound`` (``atol + rtol * |reference|``, same shape): the element with the largest
    ``diff / bound`` (NaN counts as infinite), so ``deviation <= bound`` exactly when every element
    is within its bound. ``per_step[i]``: step ``i``'s largest ``diff / bound`` times that bound (the
    deviation on the scale of the verdict's bound; with rtol 0 the plain max deviation). Where the
    bound is 0 (bit-identical checks) the plain deviations."""
    if not diff.size:
        return float("nan"), float(np.max(bound)) if np.size(bound) else float("nan"), []
    d = np.where(np.isnan(diff), np.inf, diff)
    if (bound > 0).all():
        ratio = d / bound
        k = np.unravel_index(int(np.argmax(ratio)), d.shape)
        b = float(bound[k])
        return float(d[k]), b, [float(x) * b for x in ratio.max(axis=(0, 2))]
    k = np.unravel_index(int(np.argmax(d)), d.shape)
    return float(d[k]), float(bound[k]), [float(x) for x in d.max(axis=(0, 2))]


def judge(check: Check, replicas: list, ref: dict, tol: Tolerance, *, case: str, impl: str,
          runtime: str, model: str, world_size: int | None = None) -> Verdict:
    """Compare one run with the reference under ``check``; never raises on a mismatch (a failure:
    :func:`_deviation`). ``world_size``: devices the run was spread over (default:
    ``len(replicas)``; an SPMD program reports one trajectory for a W-device mesh)."""
    w = world_size or len(replicas)
    atol, rtol = check.tol(tol)
    actual, expected = check.series(replicas, ref)
    actual = actual.astype(np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    base = dict(case=case, check=check.name, impl=impl, runtime=runtime, model=model, world_size=w)
    if actual.shape[-1] != expected.shape[-1]:
        return Verdict(**base, status="fail", atol=atol,
                       reason=f"replicas report {actual.shape[-1]} values, the reference "
                              f"{expected.shape[-1]}: the module's parameters/buffers changed shape")
    expected = np.broadcast_to(expected, actual.shape)
    diff = np.abs(actual - expected)
    if check.nan_is_absent:
        diff[np.isnan(actual) & np.isnan(expected)] = 0.0  # both absent (e.g. grad None): equal
    bound = atol + rtol * np.nan_to_num(np.abs(expected))
    bad_elem = ~(diff <= bound)  # NaN counts as bad
    max_dev, worst_bound, per_step = worst_element(diff, bound)
    bad_steps = np.flatnonzero(bad_elem.any(axis=(0, 2)))
    moved = (check.movement or movement)(ref)
    step_of, step_at, heading = _when(check, ref)
    v = Verdict(**base, status="pass", max_dev=max_dev, atol=worst_bound,
                margin=margin(max_dev, worst_bound), movement=moved,
                per_step=per_step, first_bad_step=step_of(int(bad_steps[0])) if len(bad_steps) else None)
    if len(bad_steps):
        multi = actual.shape[0] > 1
        s = bad_steps[0]
        v.replica = int(np.flatnonzero(bad_elem[:, s].any(axis=1))[0]) if multi else None
        v.status = "fail"
        names = Names(check.layout(replicas) if check.layout else None, actual.shape[-1])
        absent = check.absent(replicas) if check.absent else None
        v.reason, v.diagnosis = _deviation(names, actual, expected, diff, bound, bad_elem, step_of, step_at,
                                           heading, multi, None if absent is None else absent.astype(bool),
                                           check.nan_is_absent)
    elif w < MIN_WORLD_SIZE:
        v.status, v.reason = "vacuous", f"world size {w} < {MIN_WORLD_SIZE}: nothing is synchronised"
    elif not (moved > 0 and moved >= VACUITY_FACTOR * atol):
        v.status = "vacuous"
        v.reason = (f"{'buffers' if check.movement else 'parameters'} moved {moved:.3g} < "
                    f"{VACUITY_FACTOR:g} x atol ({VACUITY_FACTOR * atol:.3g}): the comparison cannot fail")
    return v


def judge_agreement(replicas: list, *, case: str, impl: str, runtime: str, model: str,
                    atol: float = 0.0) -> Verdict:
    """Replica agreement: every replica's parameters and optimizer state (SHA-1 digests) after
    every step equal replica 0's, within ``atol`` (0: bit-identical; a tolerance row may allow more
    where a runtime legitimately differs); a NaN/Inf parameter fails, even when every replica holds
    the same. Buffers are not compared: without SyncBatchNorm each replica updates its own."""
    w = len(replicas)
    base = dict(case=case, check=AGREEMENT, impl=impl, runtime=runtime, model=model, world_size=w)
    p0 = replicas[0]["params"].astype(np.float64)
    for r in range(w):
        n = replicas[r]["params"].shape
        if n != p0.shape:
            return Verdict(**base, status="fail", atol=atol, replica=r,
                           reason=f"replica {r} has {n[-1]} parameter values, replica 0 {p0.shape[-1]}")
    first, per_step = _first_disagreement(replicas, p0, atol)
    max_dev = float(per_step.max()) if per_step.size else 0.0
    moved = np.abs(p0[-1] - p0[0])
    moved = float(moved[np.isfinite(moved)].max()) if np.isfinite(moved).any() else 0.0
    v = Verdict(**base, status="pass", max_dev=max_dev, atol=atol, movement=moved,
                margin=(atol / max_dev if max_dev > 0 else float("inf")), per_step=[float(x) for x in per_step[1:]])
    if first is not None:
        _disagreement_reason(v, replicas, first, p0, atol)
    elif w < MIN_WORLD_SIZE:
        v.status, v.reason = "vacuous", f"world size {w} < {MIN_WORLD_SIZE}: nothing to agree on"
    elif not moved > 0:
        v.status, v.reason = "vacuous", "replica 0's parameters never changed: agreement cannot fail"
    return v


def _first_disagreement(replicas: list, p0, atol: float) -> tuple:
    """``(first, per_step)``: the earliest ``(step, kind, replica)`` where a replica breaks
    agreement (kind 0 NaN/Inf, 1 parameters, 2 optimizer state; ``None`` if none does), and
    per step the largest parameter deviation from replica 0's ``p0``."""
    per_step = np.zeros(p0.shape[0])
    first = None
    for r in range(len(replicas)):
        pr = replicas[r]["params"].astype(np.float64)
        nan_steps = np.flatnonzero(~np.isfinite(pr).all(axis=1))
        if len(nan_steps):
            first = min(first or (np.inf,), (int(nan_steps[0]), 0, r))
        if r == 0:
            continue
        d = np.abs(pr - p0)
        d[np.isnan(pr) & np.isnan(p0)] = 0.0  # the NaN itself is reported above
        d = np.where(np.isnan(d), np.inf, d).max(axis=1)
        per_step = np.maximum(per_step, d)
        bad = np.flatnonzero(d > atol)
        if len(bad):
            first = min(first or (np.inf,), (int(bad[0]), 1, r))
        dig0, digr = replicas[0].get("optim_digests", []), replicas[r].get("optim_digests", [])
        if atol == 0.0:
            for s, (a, b) in enumerate(zip(dig0, digr)):
                if a != b:
                    first = min(first or (np.inf,), (s + 1, 2, r))
                    break
    return first, per_step


def _disagreement_reason(v: Verdict, replicas: list, first: tuple, p0, atol: float) -> None:
    """``v`` failed at :func:`_first_disagreement`'s ``first``: its replica, step and reason."""
    w = len(replicas)
    names = Names(named("params")(replicas), p0.shape[-1])
    step, kind, r = first
    v.status, v.replica = "fail", r
    v.first_bad_step = step if step > 0 else None
    when = "after construction" if step == 0 else f"from step {step}"
    at = "After construction" if step == 0 else f"At step {step}"
    pr = replicas[r]["params"][step].astype(np.float64)
    if kind == 0:
        bad = ~np.isfinite(pr)
        i = int(np.flatnonzero(bad)[0])
        census, ts = names.census(bad)
        also = [q for q in range(w) if q != r and not np.isfinite(replicas[q]["params"][step]).all()]
        v.reason = (f"replica {r} has {nonfinite(pr[i])} in {names.entry(i)} {when}. {at}, {census} "
                    f"are NaN/Inf" + (f": {names.listing(ts)}" if names.named else "") + "."
                    + (f" Replica(s) {', '.join(map(str, also))} too." if also else ""))
        if not v.max_dev > 0:  # the replicas agree on NaN: no distance to report
            v.max_dev = v.margin = float("nan")
    elif kind == 1:
        d = np.abs(pr - p0[step])
        d = np.where(np.isnan(d), np.inf, d)
        i = int(np.argmax(d))
        census, ts = names.census(d > atol)
        v.reason = (f"replica {r}'s {names.entry(i)} differs from replica 0's by {d[i]:.3g} {when} "
                    f"(tolerance {atol:g}). {at}, {census} differ"
                    + (f": {names.listing(ts)}" if names.named else "") + ".")
    else:
        v.reason = (f"replica {r}'s optimizer state differs from replica 0's {when} (tolerance {atol:g})"
                    + _final_state_difference(replicas, r) + ".")


def _final_state_difference(replicas: list, r: int) -> str:
    """Where replica ``r``'s final optimizer state differs from replica 0's (the
    per-step digests say only that it does)."""
    o0, orr = replicas[0].get("optim"), replicas[r].get("optim")
    if o0 is None or orr is None or o0.shape != orr.shape:
        return ""
    d = np.abs(orr.astype(np.float64) - o0)
    d[np.isnan(orr) & np.isnan(o0)] = 0.0
    d = np.where(np.isnan(d), np.inf, d)
    if not d.size or not (d > 0).any():
        return "; the final states are equal"
    names = Names(named("optim")(replicas), d.size)
    i = int(np.argmax(d))
    census, ts = names.census(d > 0)
    return (f"; in the final state, {names.entry(i)} differs by {d[i]:.3g} ({census} differ"
            + (f": {names.listing(ts)}" if names.named else "") + ")")
