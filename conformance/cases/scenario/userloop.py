"""The loop programs on the user's own model: ``scenario.user_loop`` (``--model package.module:factory``).

The loop dimensions of ``scenario.loop``'s programs run on the module the user builds, with the
user's batches and loss, on every replica and on the single-device oracle in lockstep (the same
engine: :func:`.replica.run_loop`, :func:`.oracle.loop_reference`). What runs: the explicit
programs of :func:`user_loop_programs` (no Hypothesis draws: each drawn program would be a new
world run on a model whose cost the kit does not know), one forward per backward (with a
BatchNorm, which saves its running statistics for backward, torch's DDP raises when a second
forward broadcasts into them: pytorch/pytorch#175024).

Bound: the parity run's, measured by the kit on the model (:mod:`conformance.cases.shared.measured`),
raised for a program that carries float32 rounding further (:func:`rounding_of`); the verdict
states which. The module axis, the workload and the branch plans of the scenario model do not
apply: the user's model is what it is (a plan is carried in the JSON and unused).

Data: the forward of micro-batch ``(s, j)`` (``j >= EVAL_DATA``: a forward without backward) reads
the user's global batch ``batch(seed, s * DATA_STRIDE + j, sum(sizes))``, replica ``r`` its rows
``[sum(sizes[:r]), sum(sizes[:r + 1]))``. Replica ``r`` builds from ``rank_seed(seed, r)`` with its
floating buffers offset (as every kind), so only a DDP that broadcasts at construction matches.
"""
from __future__ import annotations

from dataclasses import replace
import json

import numpy as np

from conformance.cases.shared.checks import SCENARIO_CHECKS, UNBOUNDED
from conformance.cases.scenario.format import Scenario, buffer_sync
from conformance.cases.scenario.explicit import loop_builders
from conformance.cases.scenario.oracle import judge_scenario, loop_reference
from conformance.cases.scenario.replica import run_loop, wrap_engine
from conformance.cases.scenario.statements import before_wrap
from conformance.cases.shared.loop import rank_buffer_offset, rank_seed
from conformance.cases.shared.measured import measured_tolerance, stated, user_run
from conformance.cases.shared.readback import to_device
from conformance.errors import Unsupported
from conformance.impls.builtin import resolve_impl
from conformance.tolerances import MIN_SIDE_FACTOR, lookup
from conformance.verdict import Verdict
from fixtures import build_model, global_batch
from fixtures.models import MODELS, training_loss

#: Micro-batch ``(s, j)`` reads the user's batch ``s * DATA_STRIDE + j`` (``j`` < EVAL_DATA + evals).
DATA_STRIDE = 10_000
#: What only the scenario model can run: a teacher is a second scenario model whose prediction the
#: target blends in; a raising forward needs the scenario model's bad batch (``bad=True``).
SCENARIO_MODEL_ONLY = {"loop": {"teacher": ("frozen",)}, "eval_grad": ("raising",)}
#: The optimizer a program runs instead on a model with sparse gradients (one of
#: ``SPARSE_OPTIMIZERS``: torch.optim raises on a sparse gradient for the others).
SPARSE_STANDIN = {"sgd_wd": "sgd", "adam": "sgd_momentum", "adamw": "sgd_momentum"}


def user_loop_programs(world_size: int, seed: int, lr: float, sparse: bool = False) -> list[Scenario]:
    """The explicit loop programs run on a user's model (module docstring): SGD-family optimizers at
    the model's ``lr``, Adam / AdamW at the scenario case's (their step does not scale with the
    gradient). ``sparse``: the model has sparse gradients, which torch's Adam / AdamW, SGD's
    weight decay and ``clip_grad_norm_`` refuse on one device too: those programs run
    :data:`SPARSE_STANDIN`'s optimizer, without clipping."""
    sc, micro, ev = loop_builders(world_size, seed, False, lr)
    if sparse:
        any_grad = sc

        def sc(steps, optimizer="sgd", clip=None, **kw):  # clip_grad_norm_ has no sparse norm either
            return any_grad(steps, optimizer=SPARSE_STANDIN.get(optimizer, optimizer), **kw)
    out = [
        # zero gradients kept (set_to_none=False) under weight decay, an eval-mode validation forward
        # before each step, a learning-rate drop, a checkpoint reload (non-persistent buffers: the
        # rebuilt module's own), find_unused_parameters (the DDP walks the user's output)
        sc([{"micro": [micro()], "eval": [ev(0, "no_grad", "eval")]} for _ in range(4)], optimizer="sgd_wd",
           find_unused=True, zero_grad="zeros", lr_drop_at=2, checkpoint_at=1),
        # two synced backwards per step (each averaged, the sum kept), AdamW, clipping on the synced gradients
        sc([{"micro": [micro(sync=True), micro()]} for _ in range(3)], optimizer="adamw", clip="norm"),
        # backward in eval mode inside a no_sync window; a no_grad forward in train mode inside it and an
        # inference_mode forward after the last backward
        sc([{"micro": [micro(), micro()], "eval": [ev(1, "no_grad", "train"), ev(2, "inference_mode", "eval")]}
            for _ in range(3)], module_mode="eval"),
        # momentum, clipping, a train-mode no_grad forward before each step (the buffers it updates stay
        # each replica's at the training forward after it; rank 0's come back before the next step's)
        sc([{"micro": [micro()], "eval": [ev(0, "no_grad", "train")]} for _ in range(4)],
           optimizer="sgd_momentum", clip="norm"),
        # Adam across a checkpoint reload (its state saved and loaded), a window of three micro-steps after
        # a grad-enabled train-mode forward (validation written without no_grad: the window's first
        # forward broadcasts again, the later ones, under no_sync, do not; a broadcast armed by the
        # backward instead would leave the window on each replica's buffers)
        sc([{"micro": [micro(), micro(), micro()], "eval": [ev(0, "enabled", "train")]} for _ in range(3)],
           optimizer="adam", checkpoint_at=0, find_unused=True),
        # fine-tuning: the first layer frozen before wrapping (broadcast at construction, not reduced, left
        # out of the optimizer), unfrozen after the first step into a new DDP around the module (added to
        # the optimizer with add_param_group); a grad-enabled forward with every parameter frozen (a GAN's generator
        # step) before a no_sync window still arms the next forward's buffer broadcast; a no_grad target
        # forward between each training forward and its backward; the state dict saved on rank 0 only
        sc([{"micro": [micro(), micro()], "eval": [ev(0, "enabled", "train")]} for _ in range(3)],
           optimizer="sgd_momentum", find_unused=False, freeze="stem", unfreeze="rewrap", toggle="frozen",
           peek="no_grad", save="rank0"),
    ]
    for e in out:
        e.validate()
    return out


def has_sparse_grads(spec: str) -> bool:
    """Whether a training step of user model ``spec`` on one CPU device gives a parameter a sparse
    gradient (``Embedding`` / ``EmbeddingBag`` with ``sparse=True``)."""
    user = MODELS[spec].user
    m = build_model(spec, user.seed)
    x, y = global_batch(spec, user.seed, 0, user.global_batch)
    training_loss(spec, m(x, **MODELS[spec].forward_kwargs), y).backward()
    return any(p.grad is not None and p.grad.is_sparse for p in m.parameters())


def user_inputs(spec: str, sc: Scenario, s: int, j: int, r: int, sizes, device=None):
    """``((inputs,), forward keywords, target)`` of replica ``r``'s forward on micro-batch ``(s, j)``
    of user model ``spec`` (module docstring), on ``device`` when given."""
    import torch
    x, y = global_batch(spec, sc.seed, s * DATA_STRIDE + j, sum(sizes))
    lo = sum(sizes[:r])
    x, y = x[lo:lo + sizes[r]], y[lo:lo + sizes[r]]
    kwargs = dict(MODELS[spec].forward_kwargs)
    if device is not None:
        x, y = x.to(device), y.to(device)
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return (x,), kwargs, y


def _build(spec: str, seed: int, rank: int, salt: int = 0):
    return build_model(spec, rank_seed(seed, rank, salt), perturb_buffers=rank_buffer_offset(rank, salt))


def user_loop_task(ctx, *, impl: str, model: str, scenario: dict) -> dict:
    """World task: loop program ``scenario`` on this replica of user model ``model`` with
    implementation ``impl`` (what :func:`.replica.scenario_task` returns).

    Raises:
        Unsupported: the implementation brings its own step or optimizer, refuses a keyword or
            lacks ``no_sync``.
    """
    sc = Scenario.from_json(scenario)
    only = ([f"loop {k} {sc.loop[k]!r}" for k, vals in SCENARIO_MODEL_ONLY["loop"].items() if sc.loop[k] in vals]
            + sorted({f"a forward under {f['grad']!r}" for st in sc.steps for f in st.get("eval", ())
                      if f["grad"] in SCENARIO_MODEL_ONLY["eval_grad"]}))
    if only:
        raise Unsupported(f"{', '.join(only)}: runs on the scenario model only (scenario.loop): a teacher is a second "
                          "scenario model, a raising forward the scenario model's bad batch")
    row = resolve_impl(impl)
    if row.forward_backward is not None or row.make_optimizer is not None:
        raise Unsupported(f"{impl} brings its own {'compiled step' if row.forward_backward else 'optimizer'}, "
                          "which the loop programs (their own optimizers, micro-steps) would bypass")
    kwargs = {"broadcast_buffers": sc.ddp.get("broadcast_buffers", True)}
    if sc.ddp.get("find_unused_parameters"):
        kwargs["find_unused_parameters"] = True
    requires = ["find_unused_parameters"] if "find_unused_parameters" in kwargs else []
    if any(not sc.synced(s, j) for s in range(len(sc.steps)) for j in range(len(sc.steps[s]["micro"]))):
        requires.append("no_sync")
    which = row.shard_rank(ctx)

    def build(salt=0, module=None, optimizer=None):  # module: wrapped again (a statement's re-wrap)
        m = module
        if m is None:
            m = to_device(_build(model, sc.seed, ctx.rank, salt), ctx.device)
            before_wrap(sc.loop, m)
        engine, obs = wrap_engine(ctx, row, sc, m, kwargs, requires, optimizer=optimizer)
        ctx.mark_step()
        return m, engine, obs

    return run_loop(ctx, row, sc, build(), build,
                    lambda s, j, sizes, plan: user_inputs(model, sc, s, j, which, sizes, ctx.device),
                    lambda out, y: training_loss(model, out, y))


def user_loop_reference(spec: str, sc: Scenario, float64: bool = False) -> dict:
    """DDP's semantics for loop program ``sc`` on user model ``spec`` on one CPU device
    (:func:`.oracle.loop_reference` on rank 0's module; after the checkpoint reload a buffer absent
    from ``state_dict()`` is the rebuilt module's own). ``float64``: the module and the floating
    inputs and targets in float64 (:func:`rounding_of`)."""
    def build(rank, salt=0):
        m = _build(spec, sc.seed, rank, salt)
        return m.double() if float64 else m

    def wide(t):  # floating tensors to float64 with the module; integer targets and non-tensors as they are
        return t.double() if float64 and hasattr(t, "is_floating_point") and t.is_floating_point() else t

    def inputs(s, j, r, sizes, plan):
        (x,), kwargs, y = user_inputs(spec, sc, s, j, r, sizes)
        return (wide(x),), {k: wide(v) for k, v in kwargs.items()}, wide(y)

    net = build(0)
    before_wrap(sc.loop, net)
    init_synced = buffer_sync(sc.ddp)[0]  # rank 0's buffers at construction
    persistent = set(net.state_dict())
    names = [n for n, _ in net.named_buffers()]

    def start_buffers(r):
        own = net if init_synced or r == 0 else build(r)
        return [t.detach().clone() for t in own.buffers()]

    def reload_buffers(r, bufs):
        fresh = dict(build(0 if init_synced else r, 1).named_buffers())
        return [b if n in persistent else fresh[n].detach().clone() for n, b in zip(names, bufs)]

    return loop_reference(sc, net, inputs, lambda out, y: training_loss(spec, out, y), start_buffers, reload_buffers)


def rounding_of(spec: str, sc: Scenario, ref: dict) -> tuple[float | None, str]:
    """``(amplified, why)``: how far loop program ``sc`` carries float32 rounding on user model
    ``spec``, the largest ``|float32 oracle (ref) - float64 oracle|`` over parameters, buffers and
    final optimizer state: an optimizer that normalises the gradient (Adam) or a BatchNorm can turn
    one-ulp differences into more than the parity run's bound (docs/scenarios.md, "On your own
    model"). ``(None, why)`` when the model cannot run in float64 (``why`` names the error)."""
    try:
        wide = user_loop_reference(spec, sc, float64=True)
    except Exception as exc:  # a user's module may build float32 tensors of its own in forward
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"the float64 oracle could not run the model ({type(exc).__name__}: {first})"
    worst = 0.0
    for key in ("params", "buffers", "optim", "evals"):
        a, b = np.asarray(ref[key], dtype=np.float64), np.asarray(wide[key], dtype=np.float64)
        if a.size and a.shape == b.shape:
            worst = max(worst, float(np.max(np.abs(a - b))))
    return worst, ""


def program_tolerance(tol, amplified, why: str, k: int):
    """``tol`` (the parity run's bound, measured by the kit on the model) for loop program ``k`` (1-based):
    raised to ``MIN_SIDE_FACTOR x amplified`` where the program carries float32 rounding further
    (:func:`rounding_of`), the derivation added to its note; unchanged otherwise (the note says why
    when the float64 oracle could not run)."""
    if amplified is None:
        return replace(tol, note=f"{tol.note}; program {k}: {why}, its bound is the parity run's")
    if MIN_SIDE_FACTOR * amplified <= tol.atol:
        return tol
    atol = MIN_SIDE_FACTOR * amplified
    return replace(tol, atol=atol, note=(f"{tol.note}; program {k} carries float32 rounding to {amplified:.3g} "
                                          f"(float32 oracle vs float64 oracle): its atol {atol:.3g} = "
                                          f"{MIN_SIDE_FACTOR:g} x that"))


def evaluate_user_loop(case, impl, runtime, w, session, overrides, pick=None):
    """Verdicts of ``scenario.user_loop`` on user model ``case.model``: every program of
    :func:`user_loop_programs` (those at the indices ``pick``, or ``overrides["scenario"]``), each judged against
    :func:`user_loop_reference` with the bound the kit measures on the model; per check the worst
    deviation over the programs, or the first failing program's verdict with its JSON."""
    user = MODELS[case.model].user
    tol = measured_tolerance(session, runtime, w, user_run(impl, case.model))
    if tol is None:  # non-root process of a launcher-built world
        return None
    agree = lookup(runtime, "scenario", "agreement").atol
    programs = ([overrides["scenario"]] if "scenario" in overrides
                else user_loop_programs(w, user.seed, user.lr, has_sparse_grads(case.model)))
    programs = programs if pick is None or "scenario" in overrides else [programs[i] for i in pick]
    worst: dict = {}
    vacuous: dict = {}  # check -> programs whose reference moved too little to judge it (discarded)
    for k, sc in enumerate(programs):
        results = session.run(runtime, w, user_loop_task, timeout=case.timeout, impl=impl, model=case.model,
                              scenario=sc.to_json())
        if results is None:
            return None
        ref = user_loop_reference(case.model, sc)
        ptol = program_tolerance(tol, *rounding_of(case.model, sc, ref), k + 1)
        vs = judge_scenario(sc, results, ptol, agreement_atol=agree, ref=ref, model=case.model)
        bufs = ref["buffers"]
        for v in vs:
            if v.check == "buffers" and v.status == "vacuous" and not bufs.size:
                v.status, v.reason = "pass", "the model has no buffers: nothing to compare"
            elif v.check == "buffers" and v.status == "vacuous" and (bufs == bufs[:1, :1]).all():
                # constants (position ids, a mask): nothing moves them, and they are still compared
                v.status, v.reason = "pass", "the model's buffers are constants (equal on every replica and step)"
        if any(v.status not in ("pass", "vacuous", "skip") for v in vs):
            for v in vs:
                v.example = sc.to_json()
                if v.status != "pass":
                    v.reason = f"loop program {k + 1} of {len(programs)}: {v.reason}"
                    v.diagnosis = (f"failing loop program ({len(sc.steps)} step(s), world size {w}) on "
                                   f"--model {case.model}:\n{json.dumps(sc.to_json())}\nreproduce: python -m "
                                   f"conformance run --ddp {impl} --runtime {runtime} --world-size {w} --model "
                                   f"{case.model} --only {case.name}" + (f"\n{v.diagnosis}" if v.diagnosis else ""))
            return [stated(v, ptol) if v.check not in UNBOUNDED else v for v in vs]
        for v in vs:
            if v.status in ("vacuous", "skip"):
                vacuous.setdefault(v.check, []).append(k + 1)
            elif v.max_dev == v.max_dev and (v.check not in worst or _closer(v, worst[v.check][0])):
                worst[v.check] = (v, ptol)  # the closest to its bound, with that bound's derivation
    out = []
    n = len(programs)
    for c in SCENARIO_CHECKS:
        v, vtol = worst.get(c) or (Verdict("", c, "", "", case.model, w, "pass"), tol)
        v.reason = f"{n - len(vacuous.get(c, ()))} loop program(s)"
        if vacuous.get(c):
            what = {"buffers": "moved the buffers too little",
                    "eval_outputs": "ran no forward without backward (or moved too little)"}.get(c, f"moved {c} too little")
            v.reason += f"; program(s) {', '.join(map(str, vacuous[c]))} {what} to judge this check (discarded)"
        if len(vacuous.get(c, ())) == n:
            v.status, v.reason = (("skip", f"none of the {n} loop program(s) ran a forward without backward")
                                  if c == "eval_outputs" else
                                  ("vacuous", f"all {n} loop program(s) moved too little to fail this check"))
        out.append(stated(v, vtol) if c not in UNBOUNDED else v)
    return out


def _closer(a, b) -> bool:
    """Whether verdict ``a`` came closer to its bound than ``b`` (smaller margin; by deviation
    where a margin is not a number)."""
    if a.margin == a.margin and b.margin == b.margin:
        return a.margin < b.margin
    return a.max_dev > b.max_dev
