"""The check table and verdicts.

A check compares one run (every replica's trajectory) with the single-device
reference and returns a :class:`Verdict` whose status is one of
``pass``, ``fail``, ``vacuous``, ``unsupported`` or ``skip`` - nothing else.
``vacuous`` is returned instead of ``pass`` when the comparison could not have
failed: world size < 2, or the reference parameters moved less than
``VACUITY_FACTOR * atol`` over the run (the lr=1e-100 trap).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from .tolerances import MIN_WORLD_SIZE, VACUITY_FACTOR, Tolerance

STATUSES = ("pass", "fail", "vacuous", "unsupported", "skip")


@dataclass
class Verdict:
    """Outcome of one check on one (implementation, runtime, model, world size).

    ``max_dev`` is the largest excess-free deviation seen (max |replica - ref|),
    ``margin`` = atol / max_dev (> 1 passes; ``inf`` when equal), ``movement`` the
    reference's max |theta_K - theta_0|, ``per_step`` the max deviation per step.
    """

    check: str
    impl: str
    runtime: str
    model: str
    world_size: int
    status: str
    reason: str = ""
    max_dev: float = float("nan")
    atol: float = float("nan")
    margin: float = float("nan")
    movement: float = float("nan")
    first_bad_step: int | None = None
    per_step: list = field(default_factory=list)

    def __post_init__(self):
        assert self.status in STATUSES, self.status

    @property
    def id(self) -> str:
        return f"{self.check}[{self.impl}-{self.runtime}-w{self.world_size}-{self.model}]"

    def summary(self) -> str:
        s = f"{self.id}: {self.status}"
        if not math.isnan(self.max_dev):
            s += f" (max dev {self.max_dev:.3g}, atol {self.atol:.3g}, margin {self.margin:.3g}x"
            if self.first_bad_step is not None:
                s += f", first bad step {self.first_bad_step}"
            s += ")"
        return s + (f": {self.reason}" if self.reason else "")

    def to_json(self) -> dict:
        d = asdict(self)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


@dataclass(frozen=True)
class Check:
    """One row of the check table.

    ``series(replicas, ref) -> (actual [R, S, N], expected [S, N] or [R, S, N])``
    picks the compared quantity; ``applies(model_spec, run_spec)`` says whether
    the check is meaningful for a run (else it is not generated);
    ``tol(t) -> (atol, rtol)``.
    """

    name: str
    description: str
    series: Callable
    tol: Callable
    applies: Callable = lambda model, run: True
    movement: Callable = None  # ref -> float; default: parameter movement


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


def evaluate(check: Check, replicas: list, ref: dict, tol: Tolerance, *, impl: str,
             runtime: str, model: str) -> Verdict:
    """Compare one run with the reference under ``check``; never raises on a mismatch."""
    w = len(replicas)
    atol, rtol = check.tol(tol)
    actual, expected = check.series(replicas, ref)
    actual = actual.astype(np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape[-1] != expected.shape[-1]:
        return Verdict(check.name, impl, runtime, model, w, "fail", atol=check.tol(tol)[0],
                       reason=f"replicas report {actual.shape[-1]} values, the reference "
                              f"{expected.shape[-1]}: the module's parameters/buffers changed shape")
    expected = np.broadcast_to(np.asarray(expected, dtype=np.float64), actual.shape)
    diff = np.abs(actual - expected)
    diff[np.isnan(actual) & np.isnan(expected)] = 0.0  # both absent (e.g. grad None): equal
    bound = atol + rtol * np.nan_to_num(np.abs(expected))
    bad_elem = ~(diff <= bound)  # NaN counts as bad
    per_step = [float(x) for x in np.nanmax(np.where(np.isnan(diff), np.inf, diff), axis=(0, 2))]
    max_dev = max(per_step) if per_step else float("nan")
    bad_steps = np.flatnonzero(bad_elem.any(axis=(0, 2)))
    moved = (check.movement or movement)(ref)
    v = Verdict(check.name, impl, runtime, model, w, "pass", max_dev=max_dev, atol=atol,
                margin=(atol / max_dev if max_dev > 0 else float("inf")), movement=moved,
                per_step=per_step, first_bad_step=int(bad_steps[0]) + 1 if len(bad_steps) else None)
    if len(bad_steps):
        v.status = "fail"
        v.reason = f"{int(bad_elem.sum())} element(s) outside atol+rtol*|ref| in {len(bad_steps)} step(s)"
    elif w < MIN_WORLD_SIZE:
        v.status, v.reason = "vacuous", f"world size {w} < {MIN_WORLD_SIZE}: nothing is synchronised"
    elif not (moved > 0 and moved >= VACUITY_FACTOR * atol):
        v.status = "vacuous"
        v.reason = (f"{'buffers' if check.movement else 'parameters'} moved {moved:.3g} < {VACUITY_FACTOR:g} x atol "
                    f"({VACUITY_FACTOR * atol:.3g}): the comparison cannot fail")
    return v
