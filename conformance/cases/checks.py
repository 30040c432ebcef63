"""The check table: comparisons of one training run with the single-device reference.

A check compares every replica's trajectory with the reference (or with replica
0, for ``agreement``) and gives a :class:`~conformance.verdict.Verdict`.
``vacuous`` replaces ``pass`` when the comparison could not have failed: world
size < 2, or the reference moved less than ``VACUITY_FACTOR * atol`` over the
run (the lr=1e-100 trap).
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
    ``movement(ref) -> float`` the vacuity measure (default: parameter movement).
    """

    name: str
    description: str
    series: Callable
    tol: Callable
    applies: Callable = lambda model, run: True
    movement: Callable = None


def _params(reps, ref):
    return np.stack([r["params"][1:] for r in reps]), ref["params"][1:]


def _loss(reps, ref):
    # The loss the DDP minimises is the mean of the replicas' local losses.
    mean = np.mean([r["losses"] for r in reps], axis=0)
    return mean[None, :, None], ref["losses"][:, None]


def _optim(reps, ref):
    return np.stack([r["optim"][None] for r in reps]), ref["optim"][None]


def _buffers(reps, ref):
    exp = np.stack([ref["buffers"][1:, r] for r in range(len(reps))])
    return np.stack([r["buffers"][1:] for r in reps]), exp


def movement(ref: dict) -> float:
    """Max over elements of |theta_K - theta_0| in the reference run."""
    return float(np.max(np.abs(ref["params"][-1].astype(np.float64) - ref["params"][0])))


def buffer_movement(ref: dict) -> float:
    """Max over elements of |buffer_K - buffer_0| of rank 0 in the reference run."""
    b = ref["buffers"]
    return float(np.max(np.abs(b[-1, 0] - b[0, 0]))) if b.shape[-1] else 0.0


CHECKS = {c.name: c for c in [
    Check("param_parity", "every parameter of every replica equals the single-device "
          "reference after every step", _params, lambda t: (t.atol, t.rtol)),
    Check("loss_parity", "the replica-averaged loss equals the reference loss at every step",
          _loss, lambda t: (t.loss_atol, 0.0)),
    Check("buffer_parity", "every replica's buffers equal what upstream DDP semantics give "
          "(rank 0's broadcast before forward, then a local update) after every step",
          _buffers, lambda t: (t.atol, t.rtol), applies=lambda m, run: m.batch_coupled,
          movement=buffer_movement),
    Check("optimizer_state", "every replica's final optimizer state (momentum buffers) equals "
          "the reference's", _optim, lambda t: (t.atol, t.rtol), applies=lambda m, run: run.momentum > 0),
]}

#: Name of the replica-agreement check (see :func:`judge_agreement`).
AGREEMENT = "agreement"

#: The checks of a scenario case (:mod:`conformance.cases.scenarios`), in order: its check
#: name -> the row of :data:`CHECKS` that judges it (agreement: :func:`judge_agreement`).
SCENARIO_CHECKS = {"params": "param_parity", "buffers": "buffer_parity", "optimizer_state": "optimizer_state",
                   AGREEMENT: AGREEMENT}


def judge(check: Check, replicas: list, ref: dict, tol: Tolerance, *, case: str, impl: str,
          runtime: str, model: str, world_size: int | None = None) -> Verdict:
    """Compare one run with the reference under ``check``; never raises on a mismatch.

    ``world_size``: devices the run was spread over (default: ``len(replicas)``;
    an SPMD program reports one trajectory for a W-device mesh)."""
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
    diff[np.isnan(actual) & np.isnan(expected)] = 0.0  # both absent (e.g. grad None): equal
    bound = atol + rtol * np.nan_to_num(np.abs(expected))
    bad_elem = ~(diff <= bound)  # NaN counts as bad
    per_step = [float(x) for x in np.nanmax(np.where(np.isnan(diff), np.inf, diff), axis=(0, 2))] \
        if diff.size else []
    max_dev = max(per_step) if per_step else float("nan")
    bad_steps = np.flatnonzero(bad_elem.any(axis=(0, 2)))
    moved = (check.movement or movement)(ref)
    v = Verdict(**base, status="pass", max_dev=max_dev, atol=atol,
                margin=(atol / max_dev if max_dev > 0 else float("inf")), movement=moved,
                per_step=per_step, first_bad_step=int(bad_steps[0]) + 1 if len(bad_steps) else None)
    if len(bad_steps):
        s = bad_steps[0]
        v.replica = int(np.flatnonzero(bad_elem[:, s].any(axis=1))[0]) if actual.shape[0] > 1 else None
        v.status = "fail"
        v.reason = f"{int(bad_elem.sum())} element(s) outside atol+rtol*|ref| in {len(bad_steps)} step(s)"
    elif w < MIN_WORLD_SIZE:
        v.status, v.reason = "vacuous", f"world size {w} < {MIN_WORLD_SIZE}: nothing is synchronised"
    elif not (moved > 0 and moved >= VACUITY_FACTOR * atol):
        v.status = "vacuous"
        v.reason = (f"{'buffers' if check.movement else 'parameters'} moved {moved:.3g} < "
                    f"{VACUITY_FACTOR:g} x atol ({VACUITY_FACTOR * atol:.3g}): the comparison cannot fail")
    return v


def judge_agreement(replicas: list, *, case: str, impl: str, runtime: str, model: str,
                    atol: float = 0.0) -> Verdict:
    """Replica agreement: every replica's parameters after every step, and its
    optimizer state after every step (SHA-1 digests), equal replica 0's, within
    ``atol`` (0: bit-identical; a tolerance row may allow more where a runtime
    legitimately differs). Names the first deviating replica and step. Buffers are
    not compared: without SyncBatchNorm each replica updates them from its own shard.
    """
    w = len(replicas)
    base = dict(case=case, check=AGREEMENT, impl=impl, runtime=runtime, model=model, world_size=w)
    p0 = replicas[0]["params"].astype(np.float64)
    per_step = np.zeros(p0.shape[0])
    first = None  # (step, replica, what)
    for r in range(1, w):
        pr = replicas[r]["params"].astype(np.float64)
        if pr.shape != p0.shape:
            return Verdict(**base, status="fail", atol=atol, replica=r,
                           reason=f"replica {r} has {pr.shape[-1]} parameter values, replica 0 {p0.shape[-1]}")
        d = np.abs(pr - p0)
        d[np.isnan(pr) & np.isnan(p0)] = 0.0
        d = np.where(np.isnan(d), np.inf, d).max(axis=1)
        per_step = np.maximum(per_step, d)
        bad = np.flatnonzero(d > atol)
        if len(bad) and (first is None or bad[0] < first[0]):
            first = (int(bad[0]), r, "parameters")
        dig0, digr = replicas[0].get("optim_digests", []), replicas[r].get("optim_digests", [])
        if atol == 0.0:
            for s, (a, b) in enumerate(zip(dig0, digr)):
                if a != b:
                    if first is None or s + 1 < first[0]:
                        first = (s + 1, r, "optimizer state")
                    break
    max_dev = float(per_step.max()) if per_step.size else 0.0
    moved = float(np.nanmax(np.abs(p0[-1] - p0[0]))) if p0.size else 0.0
    v = Verdict(**base, status="pass", max_dev=max_dev, atol=atol, movement=moved,
                margin=(atol / max_dev if max_dev > 0 else float("inf")), per_step=[float(x) for x in per_step[1:]])
    if first is not None:
        step, r, what = first
        v.status, v.replica = "fail", r
        v.first_bad_step = step if step > 0 else None
        when = "after construction" if step == 0 else f"from step {step}"
        v.reason = f"replica {r}'s {what} differ from replica 0's {when} (tolerance {atol:g})"
    elif w < MIN_WORLD_SIZE:
        v.status, v.reason = "vacuous", f"world size {w} < {MIN_WORLD_SIZE}: nothing to agree on"
    elif not moved > 0:
        v.status, v.reason = "vacuous", "replica 0's parameters never changed: agreement cannot fail"
    return v
