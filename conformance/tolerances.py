"""The tolerance table: every number a parity check depends on, in one place.

A row gives, for (runtime, model, dtype), the training setup (lr, steps, global
batch, seed) and the bounds (atol, rtol on parameters and buffers, loss_atol on
the replica-averaged loss). ``"*"`` matches any runtime. The most specific row
wins. ``VACUITY_FACTOR`` is the guard: a run whose parameters move less than
``VACUITY_FACTOR * atol`` (max over elements of |theta_K - theta_0| in the
single-device reference) proves nothing and is reported ``vacuous``.

Choice of numbers: a float32 bound sits between the noise of correct runs (their largest
deviation from the reference) and the signal of the mutants (the weakest one's), with at least
:data:`MIN_SIDE_FACTOR` on each side. ``python -m conformance calibrate`` measures both for a row
and exits 1 when the bound is misplaced; ``run --repeat N`` sweeps seeds for flakiness
(docs/calibration.md, with the figures). atol = 1e-5 sits >= 28x above the float32 noise and
>= 50x below the weakest signal (clip_local_grad on linear). rtol is 0: parameters are O(1), so
one absolute bound keeps the margin readable.
"""
from __future__ import annotations

from dataclasses import dataclass

VACUITY_FACTOR = 100.0
MIN_WORLD_SIZE = 2
#: The safety factor between a bound and what it separates: ``atol >= MIN_SIDE_FACTOR x noise``
#: (and, where the signal is known, ``<= signal / MIN_SIDE_FACTOR``); calibrate checks a row
#: against it, and a user model's bound is derived with it (conformance.cases.shared.measured).
MIN_SIDE_FACTOR = 10.0


@dataclass(frozen=True)
class Tolerance:
    """One row of the tolerance table: the bounds of a parity check *and* the training setup they
    were measured on, for one (runtime, model, dtype). A bound holds only for the setup it was
    calibrated with, so the row carries both; the ``train`` cases run that setup.

    Attributes:
        runtime, model, dtype: what the row applies to (``runtime`` ``"*"``: any).
        lr, steps, global_batch, seed: the training setup (learning rate, optimizer steps,
            samples per step over the world, the seed of model and data).
        atol, rtol: the bound on parameters and buffers (``atol + rtol * |reference|``).
        loss_atol: the bound on the replica-averaged loss.
        note: why the numbers are what they are.

    The field names are the keys of the JSON report's ``tolerances`` rows.
    """

    runtime: str
    model: str
    dtype: str
    lr: float
    steps: int
    global_batch: int
    atol: float
    rtol: float
    loss_atol: float
    seed: int = 1234
    note: str = ""


TOLERANCES = [
    Tolerance("*", "linear", "float32", lr=0.1, steps=20, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="upstream SmallNet shape, lr 0.1 (#8489)"),
    Tolerance("*", "mlp", "float32", lr=0.05, steps=5, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="~2.2 MB of weights: several 1 MB buckets"),
    Tolerance("*", "batchnorm", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="buffers: running stats"),
    # PJRT: XLA's BatchNorm statistics round differently from CPU torch's, and tiny
    # per-replica batches amplify it past the bound for every DDP; with >= 6 samples a
    # replica (global batch 48) the noise is CPU's again and every mutant is still killed,
    # so the setup, not atol, changes (docs/runtimes/pjrt.md).
    Tolerance("pjrt", "batchnorm", "float32", lr=0.1, steps=10, global_batch=48,
              atol=1e-5, rtol=0.0, loss_atol=1e-5,
              note="buffers: running stats; >= 6 samples per replica up to W=8 (XLA BatchNorm)"),
    Tolerance("*", "dropout", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="dropout masks replayed per replica's generator stream"),
    Tolerance("*", "frozen", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="first layer requires_grad=False"),
    Tolerance("*", "tied", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="encoder/decoder share a weight"),
    Tolerance("*", "unused", "float32", lr=0.1, steps=1, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="gradients compared after one backward"),
    # Mixed precision: forward under bfloat16 autocast (unit roundoff 2**-8), float32
    # parameters and gradients. The noise grows with the steps; atol 3e-3 keeps ~10x over
    # it, and lr/steps are raised until parameters move >= 100 x atol.
    Tolerance("*", "linear", "bf16-autocast", lr=0.2, steps=40, global_batch=24,
              atol=3e-3, rtol=0.0, loss_atol=3e-3, note="bf16 autocast forward"),
    # Generated scenarios (conformance/cases/scenario/): each scenario brings its own lr and
    # length; the row gives the bounds (docs/scenarios.md).
    Tolerance("*", "scenario", "float32", lr=0.0, steps=0, global_batch=0,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="generated scenarios"),
    # The workload case's dtypes (scenario.workload, docs/scenarios.md): a float64 model keeps a
    # float64 bound; a bfloat16 branch between float32 layers a bfloat16 one. complex64 is float32
    # precision (the float32 row). The noise of each (docs/scenarios.md, "Oracle and bounds"):
    # float32/complex64 far below 1e-5; float64 far below 1e-12, while a float32 reduction
    # (fp32_fusion_buffer) deviates >= 1e-9; bfloat16: torch's DDP flips bfloat16 values by one ulp
    # (it divides the bf16 bucket before summing), hence atol 8e-3 + rtol 2^-5 (4-8 ulp).
    # bfloat16 runs are short (<= 8 steps).
    Tolerance("*", "scenario", "float64", lr=0.0, steps=0, global_batch=0,
              atol=1e-12, rtol=0.0, loss_atol=1e-12, note="generated scenarios, float64 workload"),
    Tolerance("*", "scenario", "bf16-mixed", lr=0.0, steps=0, global_batch=0,
              atol=8e-3, rtol=2 ** -5, loss_atol=8e-3, note="generated scenarios, bfloat16 branch"),
    # Graph shape: checkpointed and branch-shared parameters. atol 1e-5 sits >= 330x above the
    # noise of correct DDPs and >= 120x below the signal of reduce_at_first_firing (calibrate
    # re-measures both, docs/calibration.md).
    Tolerance("*", "checkpoint_reentrant", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="block under reentrant checkpoint, applied twice"),
    Tolerance("*", "checkpoint_nonreentrant", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="block under non-reentrant checkpoint, applied twice"),
    Tolerance("*", "checkpoint_reentrant_reuse", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="block used outside and inside a reentrant checkpoint"),
    Tolerance("*", "shared_branches", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="one Linear on two branches"),
    # The module axis (docs/scenarios.md "The module axis", with the figures): float32 models whose
    # forwards differ in structure, not arithmetic: the float32 noise, and mutants that deviate
    # >= 1.5e-4 at step 1 (forward_hooks_skipped's loss; the others far more).
    Tolerance("*", "structured_output", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="dataclass/dict/namedtuple output, keyword forward"),
    Tolerance("*", "buffer_kinds", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="non-persistent, int64 and rebound buffers"),
    Tolerance("*", "hooks_containers", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="pre-hook, parametrization, ParameterList/Dict"),
    # Compressing comm hooks: torch's fp16_compress_hook / bf16_compress_hook round each bucket to
    # 16 bits before the all-reduce (docs/scenarios.md, "Comm hooks", with the figures). fp16: atol
    # 3e-4 is ~11x over the noise, the movement ~500x atol. bf16 (tests/outside CorrectDDP only:
    # torch's DDP refuses the hook on CPU) at lr 0.2, 40 steps: atol 3e-3 is ~9x over the noise and
    # ~100x below the movement. Signal (a sum-not-mean hook, comm_hook_no_divide): ~2e-2 from step 1.
    Tolerance("*", "linear", "fp16-comm", lr=0.1, steps=20, global_batch=24,
              atol=3e-4, rtol=0.0, loss_atol=3e-4, note="fp16_compress_hook"),
    Tolerance("*", "linear", "bf16-comm", lr=0.2, steps=40, global_batch=24,
              atol=3e-3, rtol=0.0, loss_atol=3e-3, note="bf16_compress_hook"),
    # The workload corners (fixtures/models.py, docs/scenarios.md "The workload axis"): the float32
    # corners keep float32 noise (far below 1e-5); float64's is ~1e-16 (atol 1e-12: a float32
    # reduction's rounding, ~1e-8, is far above it); mixed_dtype's bfloat16 parameters differ by
    # 1-2 ulp, hence rtol 2^-6 = 2-4 ulp, and they move >= 100 x atol.
    # Each model has its own row (one dtype regime each) under the run key "float32", which
    # calibrate and repeat look a parity model up under.
    Tolerance("*", "sparse_embedding", "float32", lr=0.5, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="sparse gradient (Embedding sparse=True)"),
    Tolerance("*", "channels_last", "float32", lr=0.2, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="channels_last conv weight + transposed parameter"),
    Tolerance("*", "complex64", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-5, rtol=0.0, loss_atol=1e-5, note="complex64 weight, real loss"),
    Tolerance("*", "float64", "float32", lr=0.1, steps=10, global_batch=24,
              atol=1e-12, rtol=0.0, loss_atol=1e-12, note="float64 parameters and loss"),
    Tolerance("*", "mixed_dtype", "float32", lr=0.2, steps=20, global_batch=24,
              atol=2e-3, rtol=2 ** -6, loss_atol=6e-3, note="one bfloat16 layer between float32 layers"),
    # Replica agreement: replicas that apply the same reduced gradient hold the
    # same bits (correct runs are bit-identical to replica 0 at every step).
    Tolerance("*", "*", "agreement", lr=0.0, steps=0, global_batch=24,
              atol=0.0, rtol=0.0, loss_atol=0.0, note="replicas bit-identical to replica 0"),
    # Copies (broadcasts) must be bit-identical.
    Tolerance("*", "*", "exact", lr=0.0, steps=0, global_batch=24,
              atol=0.0, rtol=0.0, loss_atol=0.0, note="broadcast copies: bit-identical"),
    # feature.subgroups (process groups of two) uses the linear float32 row: atol 1e-5 is >= 40x
    # above its noise and >= 5800x below its mutants' signal (group_sum_global_divide,
    # broadcast_global_rank0).
]


def lookup(runtime: str, model: str, dtype: str = "float32") -> Tolerance:
    """Most specific row for ``(runtime, model, dtype)``.

    Raises:
        KeyError: no row covers the combination (message names it).
    """
    rows = [t for t in TOLERANCES if t.model in (model, "*") and t.dtype == dtype
            and t.runtime in (runtime, "*")]
    if not rows:
        raise KeyError(f"no tolerance row for runtime={runtime} model={model} dtype={dtype}")
    return sorted(rows, key=lambda t: (t.runtime == "*", t.model == "*"))[0]
