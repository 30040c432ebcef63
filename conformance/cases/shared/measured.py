"""The tolerance of a user's model (``--model``), measured on that model.

The kit's own models have bounds in the tolerance table, set once by ``calibrate``. A user's
model has none, so before judging a DDP on it the kit measures the noise of a correct run:
the reference DDP (``ref``, :mod:`ddp_impl`) trains the model on the same world over
:data:`NOISE_SEEDS` seeds (the run's seed and the next ones), and each run is compared with
the single-device reference, as a verdict would. The bound is the kit's safety-factor policy
applied to that noise (:data:`conformance.tolerances.MIN_SIDE_FACTOR`, the factor
``calibrate`` asks of every table row)::

    atol      = MIN_SIDE_FACTOR * max(noise on parameters (and compared buffers), eps * max |theta| (and buffers))
    loss_atol = MIN_SIDE_FACTOR * max(noise on the averaged loss,              eps * max |loss|)

``eps`` is float32's machine epsilon (the kit compares float32 trajectories): a floor for a
model whose measured noise is 0 (bit-exact at small world sizes), one ulp of its largest
value. The vacuity guard is the table's: a run whose reference parameters move less than
``VACUITY_FACTOR * atol`` is ``vacuous``. The derivation is stated in every parity verdict's
reason (:func:`stated`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from conformance.cases.shared.checks import CHECKS, movement
from conformance.cases.shared.loop import RunSpec
from conformance.cases.shared.numerics import UNIT_ROUNDOFF
from conformance.cases.shared.reference import reference_run
from conformance.errors import Unsupported
from conformance.impls.builtin import resolve_impl
from conformance.tolerances import MIN_SIDE_FACTOR, VACUITY_FACTOR, Tolerance
from conformance.worlds.runtimes import world_key
from conformance.worlds.failure import ReplicaError
from fixtures.models import MODELS

#: Seeds of the noise measurement: the run's seed and the next ones.
NOISE_SEEDS = 3
#: float32's machine epsilon (2**-23, twice its unit roundoff): the floor of the measured noise,
#: relative to the values.
EPS32 = 2 * UNIT_ROUNDOFF["float32"]
#: The implementation whose runs are the noise: the kit's reference DDP (correct by the table).
NOISE_IMPL = "ref"


def user_run(impl: str, model: str, **overrides) -> RunSpec:
    """The training run of user model ``model`` (its :class:`conformance.UserModel`'s ``lr``,
    ``steps``, ``global_batch``, ``seed``) for ``impl``, with RunSpec ``overrides``."""
    user = MODELS[model].user
    return RunSpec(**{**dict(impl=impl, model=model, lr=user.lr, steps=user.steps, global_batch=user.global_batch,
                             seed=user.seed), **overrides})


def _max_abs(a, b) -> float:
    d = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    return float(np.max(d)) if d.size else 0.0


def measured_tolerance(session, runtime: str, w: int, spec: RunSpec) -> Tolerance | None:
    """The bound of ``spec`` (a user model's run) at world size ``w`` on ``runtime``, measured
    with :data:`NOISE_IMPL` over :data:`NOISE_SEEDS` seeds (module docstring); cached per
    (runtime, W, run) in ``session``. ``None`` on a non-root process of a launched world.

    Raises:
        Unsupported: the reference DDP cannot train the model there (the bound cannot be
            measured; the reason says why).
    """
    key = (runtime, w, replace(spec, impl=NOISE_IMPL))
    cache = session.measured_tolerances
    if key in cache:
        return cache[key]
    row = resolve_impl(NOISE_IMPL)
    if row.unsupported.get(runtime):
        raise Unsupported(f"the bound is measured with the reference DDP, which runtime {runtime} cannot run: "
                          f"{row.unsupported[runtime]}")
    world = world_key(runtime, row.topology.get(runtime), w)
    buffers = CHECKS["buffer_parity"].applies(MODELS[spec.model], spec)
    noise = loss_noise = scale = loss_scale = 0.0
    moved = float("inf")
    seeds = [spec.seed + k for k in range(NOISE_SEEDS)]
    for seed in seeds:
        run = replace(spec, impl=NOISE_IMPL, seed=seed)
        try:
            reps = session.trajectories(world, None, run)
        except ReplicaError as exc:
            raise Unsupported(f"the bound could not be measured: the reference DDP failed on the model "
                              f"(seed {seed}): {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        except Unsupported as exc:
            raise Unsupported(f"the bound is measured with the reference DDP, which cannot train this run: "
                              f"{exc.reason}") from None
        if reps is None:
            return None
        ref = reference_run(run, w, world.world)
        for i, r in enumerate(reps):
            noise = max(noise, _max_abs(r["params"], ref["params"]))
            if buffers:
                noise = max(noise, _max_abs(r["buffers"], ref["buffers"][:, i]))
        loss_noise = max(loss_noise, _max_abs(np.mean([r["losses"] for r in reps], axis=0), ref["losses"]))
        scale = max(scale, float(np.max(np.abs(ref["params"]))) if ref["params"].size else 0.0)
        if buffers and ref["buffers"].size:  # compared at the same atol: their ulp counts too
            scale = max(scale, float(np.max(np.abs(ref["buffers"]))))
        loss_scale = max(loss_scale, float(np.max(np.abs(ref["losses"]))))
        moved = min(moved, movement(ref))
    atol = MIN_SIDE_FACTOR * max(noise, EPS32 * scale)
    loss_atol = MIN_SIDE_FACTOR * max(loss_noise, EPS32 * loss_scale)
    note = (f"bound measured on the model: atol {atol:.3g} = {MIN_SIDE_FACTOR:g} x max(noise {noise:.3g}, "
            f"eps32 x max|{'param, buffer' if buffers else 'param'}| {EPS32 * scale:.3g}), loss_atol {loss_atol:.3g} = {MIN_SIDE_FACTOR:g} x "
            f"max(noise {loss_noise:.3g}, eps32 x max|loss| {EPS32 * loss_scale:.3g}); noise = the largest "
            f"deviation of the reference DDP ({NOISE_IMPL}) from one device over seeds {seeds[0]}..{seeds[-1]} "
            f"at W={w}; vacuity guard: parameters move >= {VACUITY_FACTOR:g} x atol (measured "
            f"{moved:.3g})")
    tol = Tolerance(runtime, spec.model, spec.dtype, lr=spec.lr, steps=spec.steps, global_batch=spec.global_batch,
                    atol=atol, rtol=0.0, loss_atol=loss_atol, seed=spec.seed, note=note)
    cache[key] = tol
    return tol


def stated(verdict, tol: Tolerance):
    """``verdict`` with the derivation of its bound (``tol.note``) added to its reason."""
    verdict.reason = f"{verdict.reason}; {tol.note}" if verdict.reason else tol.note
    return verdict
