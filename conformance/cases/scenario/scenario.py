"""Generated training scenarios: data, the replica task, the single-device oracle, the judge.

A **scenario** is JSON-serialisable data: a sequence of optimizer steps, each an
accumulation window of ``k`` micro-steps (the first ``k - 1`` under ``no_sync()``,
the last synced), and for every micro-step and replica a local batch size
(uneven allowed) and a *plan*: which branches of the scenario model the replica
uses and in which order (rank-dependent control flow, so gradient hooks fire in
rank-dependent orders and parameters go unused on some replicas). Around it: DDP
keywords (``find_unused_parameters``, ``broadcast_buffers``, buckets, a comm
hook), buffer rebinding in forward, a loss scale (gradients up to where fp16
communication overflows; unscaled before the step, as ``GradScaler`` does), the
optimizer (SGD, SGD with momentum, Adam, AdamW), a checkpoint save/reload of
DDP + optimizer state mid-run, and the length (up to 120 steps).

The oracle computes **DDP's semantics** on one device for any scenario: every
replica's accumulated gradient over the window (its own micro-batches, its own
local-mean losses), then the equal average over replicas (not the global-batch
gradient: with uneven local batches the two differ). A parameter no replica used
in the whole window keeps no gradient (``find_unused_parameters``: globally
unused); one used only by some replicas, or only in the ``no_sync`` micro-steps,
is averaged with zeros from the others. Buffers follow torch's DDP: with
``broadcast_buffers`` a forward starts from rank 0's buffers when the previous
forward was synced (or it is the first), i.e. at the start of an accumulation
window (``torch.nn.parallel.DistributedDataParallel._pre_forward`` /
``_post_forward``: ``require_forward_param_sync``).

The scenario model's buffers do not feed its output (an exponential moving
average of the stem activations and a forward counter), so buffer semantics are
judged by the buffer check and cannot mask a gradient fault.

The package's seams: :mod:`.format` (the JSON data, its dimensions and validation), :mod:`.model`
(the scenario model and its data), :mod:`.oracle` (DDP's semantics on one device, the judge),
:mod:`.generate` (Hypothesis strategies, explicit scenarios); this module holds the replica task
and the case runner, and re-exports the others' public names (the import path users know).
"""

from __future__ import annotations

from dataclasses import replace
import contextlib
import json

import numpy as np

from conformance.cases.shared.checks import SCENARIO_CHECKS
from conformance.cases.shared.search import (SearchRunner, kit_settings, loop_depth, loop_examples, scenario_examples,
                                      workload_examples)
from conformance.cases.shared.commhooks import register_hook
from conformance.cases.shared.loop import build_optimizer, mse, rank_buffer_offset, rank_seed, wrap
from conformance.cases.surface import cells_of, joint_cells
from conformance.cases.shared.transparency import merged, observed_wrap
from conformance.cases.shared.readback import (buffer_layout, flat_buffers, flat_optimizer_state, flat_params,
                                              optimizer_state_layout, param_layout, saved_checkpoint,
                                              state_digest, to_device)
from conformance.errors import Unsupported
from conformance.impls.builtin import resolve_impl
from conformance.tolerances import lookup
from conformance.verdict import Verdict
from conformance.worlds.runtimes import get_runtime

from conformance.cases.scenario.format import (  # noqa: F401 (re-exported)
    BRANCHES, CLIP_NORM, DDP_DEFAULTS, DDP_KEYS, EVAL_DATA, EVAL_GRAD, EVAL_KEYS, EVAL_MODE, FORWARD_DATA,
    HIDDEN, INDICES_PER_SAMPLE, IN_FEATURES, LOOPS, LR_DROP, MICRO_KEYS, MICRO_OPTIONAL, MODULES,
    MODULE_PHRASES, OPTIMIZER_REVEALS, OPTIONAL_KEYS, OUT_FEATURES, PLAIN_LOOP, PLAIN_MODULE,
    PLAIN_WORKLOAD, SCENARIO_KEYS, SHORT_RUN_DTYPES, SPARSE_OPTIMIZERS, STEP_KEYS, STEP_OPTIONAL, TEACHER_SALT,
    Scenario, ScenarioError, ScenarioOutput, UPSTREAM_DEFECTS, VOCAB, WORKLOADS, WORKLOAD_PHRASES,
    XLA_UNSUPPORTED, XLA_UNSUPPORTED_LOOP, grad_mode, load_scenario, prediction_of, workload_corners,
    xla_unsupported)
from conformance.cases.scenario.model import (  # noqa: F401 (re-exported)
    BadBatch, build_scenario_model, forward_kwargs, scenario_batch, scenario_indices, scenario_mask, seen_start,
    user_grad_hook)
from conformance.cases.scenario.oracle import (  # noqa: F401 (re-exported)
    distilled_target, judge_scenario, scenario_reference)
from conformance.cases.scenario.generate import (  # noqa: F401 (re-exported)
    DDP_EXTRAS, FEW_BATCHES, FEW_PLANS, FEW_UNUSED_PLANS, LRS, Space, WORKLOAD_TOLERANCE, judged_on,
    scenario_tolerance, scenarios, space_problem, space_requires, workloads)
from conformance.cases.scenario.explicit import (  # noqa: F401 (re-exported)
    explicit_loop_scenarios, explicit_scenarios, explicit_workload_scenarios)


# --------------------------------------------------------------------------
# the replica task
# --------------------------------------------------------------------------

def scenario_task(ctx, *, impl: str, scenario: dict) -> dict:
    """World task: run ``scenario`` on this replica with implementation ``impl``.

    Returns ``params`` float32 ``[S+1, P]``, ``buffers`` float64 ``[S+1, B]`` (after
    construction and after each optimizer step), ``optim_digests`` (SHA-1 per step),
    ``optim`` (final optimizer state, float64), ``layout`` (the tensors' names and
    shapes, as :func:`conformance.cases.shared.loop.train_replica` gives them).

    Raises:
        Unsupported: the implementation refuses a keyword or lacks no_sync /
            register_comm_hook.
    """

    import torch

    sc = Scenario.from_json(scenario)
    row = resolve_impl(impl)
    if row.forward_backward is not None or row.make_optimizer is not None:
        raise Unsupported(f"{impl} brings its own {'compiled step' if row.forward_backward else 'optimizer'}, "
                          "which the scenario loop (its own optimizers, micro-steps) would bypass")
    r = ctx.rank
    # Only keywords that change something are passed (a recipe without them stays usable);
    # broadcast_buffers always, unless the scenario leaves it at torch's default (None).
    bcast = sc.ddp.get("broadcast_buffers", True)
    kwargs = {} if bcast is None else {"broadcast_buffers": bcast}
    kwargs.update({k: v for k, v in sc.ddp.items() if k not in ("comm_hook", "broadcast_buffers")
                   and v != DDP_DEFAULTS[k]})
    # every replica runs every branch at every micro-step: find_unused_parameters changes
    # nothing (torch's DDP reduces the same gradients), so a DDP refusing it still runs;
    # skip_all_reduce_unused_params is drawn only where every replica leaves the same branches
    # unused, where it changes nothing either; the performance switches change no number
    every_branch = all(set(p) == set(BRANCHES) for s in sc.steps for m in s["micro"] for p in m["plan"])
    optional = ("skip_all_reduce_unused_params", "batched_grad_copy", "bucket_cap_mb_list") + (
        ("find_unused_parameters",) if every_branch else ())
    requires = [k for k in kwargs if k != "broadcast_buffers" and k not in optional]
    if any(not sc.synced(s, j) for s in range(len(sc.steps)) for j in range(len(sc.steps[s]["micro"]))):
        requires.append("no_sync")
    if sc.ddp.get("comm_hook"):
        requires.append("register_comm_hook")

    why = xla_unsupported(sc.workload) if str(ctx.device).startswith("xla") else None
    if why:
        raise Unsupported(f"workload {workload_corners(sc.workload)}: {why}")
    if str(ctx.device).startswith("xla") and any(f["grad"] == "inference_mode" for st in sc.steps
                                                 for f in st.get("eval", ())):
        raise Unsupported(XLA_UNSUPPORTED_LOOP[("eval", "inference_mode")])
    sparse = sc.workload["grad"] != "dense"

    # init_sync=False: the user builds equal parameters (rank 0's seed); buffers stay each replica's
    owner = r if sc.ddp.get("init_sync", True) else 0

    def build(salt=0):  # replica r from its own seed and ema offset: only a DDP that broadcasts matches
        m = to_device(build_scenario_model(rank_seed(sc.seed, owner, salt), sc.rebind_buffers,
                                           rank_buffer_offset(r, salt), sc.workload, sc.module), ctx.device)
        ddp, obs = observed_wrap(row, m, ctx, lambda: wrap(row, m, ctx, kwargs, tuple(requires), optional))
        user_grad_hook(m, sc.module)
        if sc.ddp.get("comm_hook"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            register_hook(ddp, row.name, default_hooks.allreduce_hook)
        ctx.mark_step()
        return m, ddp, build_optimizer(sc.optimizer, ddp.parameters(), sc.lr), obs

    try:
        built = build()
    except NotImplementedError as exc:  # a library's refusal of a corner at construction (same on every replica)
        if not workload_corners(sc.workload):
            raise
        raise Unsupported(f"{impl} refuses workload {workload_corners(sc.workload)}: "
                          f"NotImplementedError: {exc}") from None
    which = row.shard_rank(ctx)

    def inputs(s, j, sizes, plan):  # the forward's arguments on the device (no plan: a forward without backward)
        n = sizes[which]
        x, y = scenario_batch(sc.seed, s, j, which, n)
        extra = {} if plan is None else {"plan": plan}
        if sparse:
            extra["idx"] = scenario_indices(sc.seed, s, j, which, n).to(ctx.device)
        extra.update({k: v.to(ctx.device) if isinstance(v, torch.Tensor) else v  # MODULES "kwargs"
                      for k, v in forward_kwargs(sc.module, sc.seed, s, j, which, n).items()})
        return (x.to(ctx.device),), extra, y.to(ctx.device)

    return run_loop(ctx, row, sc, built, build, inputs, lambda out, y: mse(prediction_of(out), y),
                    blend=distilled_target)


def run_loop(ctx, row, sc: Scenario, built, build, inputs, loss, blend=None) -> dict:
    """The model-agnostic replica side of loop program ``sc`` on this replica (what
    :func:`scenario_task` returns): ``built`` the ``(module, ddp, optimizer, observer)``
    constructed (the :class:`~conformance.cases.shared.transparency.Observer` of the wrap), ``build(salt)``
    a new one (the checkpoint reload; ``TEACHER_SALT``: the teacher),
    ``inputs(s, j, sizes, plan)`` -> ``(args, kwargs, target)`` on the device for micro-batch
    ``(s, j)`` (``j >= EVAL_DATA``: a forward without backward, ``plan`` None), ``loss(out,
    target)`` the scalar to backpropagate, ``blend(teacher_out, target)`` the target with a teacher.

    Raises:
        ValueError: the program has a teacher and no ``blend`` was given.
    """
    import torch

    model, ddp, opt, obs = built
    observers = [obs]
    scale = 2.0 ** sc.loss_scale_log2
    lp = sc.loop
    training = lp["module_mode"] == "train"
    teacher = None
    if lp["teacher"] != "none":  # a second DDP in the loop: built after the trained one, never trained
        if blend is None:
            raise ValueError("a loop program with a teacher needs the target's blend")
        t_model, teacher, _, t_obs = build(TEACHER_SALT)
        t_obs.close()  # never trained: its own wrap was observed, its forwards are not
        (teacher if callable(getattr(teacher, "train", None)) else t_model).train(False)

    def evaluate(s, at):  # forwards without backward (the loop programs), output discarded
        for e, f in sc.evals(s, at):
            args, kwargs, _ = inputs(s, EVAL_DATA + e, f["batch"], None)
            set_mode(f["mode"] == "train")
            with grad_mode(f["grad"]):
                if f["grad"] != "raising":
                    obs.call(ddp, *args, **kwargs)
                else:  # a bad batch the loop skips: the module raises after its buffers moved
                    try:
                        obs.call(ddp, *args, **dict(kwargs, bad=True))
                    except BadBatch:
                        pass
            set_mode(training)
            ctx.mark_step()

    def set_mode(train):  # as a user does: on the wrapper (which sets the module's mode)
        (ddp if callable(getattr(ddp, "train", None)) else model).train(train)

    if not training:
        set_mode(False)
    params, buffers, digests = [flat_params(model)], [flat_buffers(model)], []
    for s, step in enumerate(sc.steps):
        opt.zero_grad(set_to_none=lp["zero_grad"] == "set_to_none")
        for group in opt.param_groups:
            group["lr"] = sc.lr_at(s)
        micro = step["micro"]
        for j, m in enumerate(micro):
            evaluate(s, j)
            plan = tuple(m["plan"][row.shard_rank(ctx)])
            ctxm = contextlib.nullcontext() if sc.synced(s, j) else ddp.no_sync()
            with ctxm:
                total = 0
                for k in range(sc.forwards(s, j)):  # forwards before the one backward (a GAN's D)
                    args, kwargs, y = inputs(s, FORWARD_DATA * k + j, m["batch"], plan)
                    if teacher is not None:
                        targs, tkwargs, _ = inputs(s, FORWARD_DATA * k + j, m["batch"], None)
                        with torch.no_grad():
                            y = blend(teacher(*targs, **tkwargs), y)
                    total = total + loss(obs.call(ddp, *args, **kwargs), y)
                with obs.unchanged_by("backward"):
                    (total * scale).backward()
            if j < len(micro) - 1:
                ctx.mark_step()
        evaluate(s, len(micro))
        if row.after_backward is not None:
            row.after_backward(ddp, opt, ctx)
        if scale != 1.0:
            with torch.no_grad():
                for q in model.parameters():
                    if q.grad is not None:
                        q.grad.div_(scale)
        if lp["clip"] == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        with obs.unchanged_by("the optimizer step"):
            if row.optimizer_step is not None:  # the strategy's step replaces optimizer.step()
                row.optimizer_step(ddp, opt, ctx)
            else:
                opt.step()
        ctx.mark_step()
        obs.after_step(s + 1, modes=False)  # the loop sets modes itself (eval forwards)
        params.append(flat_params(model))
        buffers.append(flat_buffers(model))
        digests.append(state_digest(flat_optimizer_state(opt)))
        if sc.checkpoint_at == s:
            model_state, optim_state = saved_checkpoint(ddp.state_dict(), opt.state_dict())
            obs.close()
            model, ddp, opt, obs = build(salt=1)
            observers.append(obs)
            model.load_state_dict(model_state)
            opt.load_state_dict(optim_state)
            if not training:
                set_mode(False)
    layout = {"params": param_layout(model), "buffers": buffer_layout(model),
              "optim": optimizer_state_layout(opt, None, model)}
    return {"params": np.stack(params), "buffers": np.stack(buffers), "optim_digests": digests,
            "optim": flat_optimizer_state(opt), "layout": layout, "transparency": merged(observers)}


def run_scenario_case(space: Space, runner, tol, agreement_atol: float, max_examples: int,
                      shrink: bool = True) -> list:
    """Run the explicit scenarios, then ``max_examples`` generated ones, on ``runner``
    (a :class:`conformance.cases.shared.search.SearchRunner`), each judged with ``tol(scenario)`` (its
    workload's tolerance row); Hypothesis shrinks a failing scenario to a minimal one (unless
    ``shrink`` is false: the first failing one).

    Returns one :class:`~conformance.verdict.Verdict` per :data:`~conformance.cases.shared.checks.SCENARIO_CHECKS`
    (case fields filled by the caller): on a pass, the worst deviation over all
    examples; on a failure, the minimal failing scenario's verdicts, with the
    scenario JSON in ``example`` and a reproducer in ``diagnosis``.

    Raises:
        Unsupported: the implementation cannot serve the scenarios.
    """
    from hypothesis import given

    worst: dict = {}
    # + "crashed": a Scenario; "cells": what the keyword scenarios exercised (surface.cells_of)
    state = {"examples": 0, "vacuous": 0, "failing": None, "unsupported": {}, "cells": set()}

    def check(sc: Scenario):
        try:
            results = runner.run(scenario_task, scenario=sc.to_json())
        except Unsupported as exc:
            # The implementation lacks a corner, a keyword or a method this example needs: this
            # example is unsupported, the others still run (SearchRunner would re-raise it for all).
            runner.error = None
            state["unsupported"].setdefault(str(exc), sc.describe_workload() or "plain workload")
            return
        except Exception:
            # the first scenario a replica failed on: the runner re-raises its failure for every later
            # example, so Hypothesis's "minimal" example of a crash is not one that crashes
            state.setdefault("crashed", sc)
            raise
        vs = judge_scenario(sc, results, tol(sc), agreement_atol=agreement_atol)
        state["examples"] += 1
        if "keywords" in space.ddp_extra:
            state["cells"] |= cells_of(sc)
        bad = [v for v in vs if v.status == "fail"]
        if bad:
            state["failing"] = (sc, vs)
            state.setdefault("first_failing", (sc, vs))  # unshrunk: it trained enough to judge
            raise AssertionError("; ".join(f"{v.check}: {v.reason}" for v in bad))
        if any(v.status == "vacuous" for v in vs if v.check == "params"):
            state["vacuous"] += 1
            return
        for v in vs:
            if v.status == "pass" and v.max_dev == v.max_dev and (
                    v.check not in worst or v.max_dev > worst[v.check].max_dev):
                worst[v.check] = v

    # Generated scenarios first (a failure is shrunk to a minimal scenario), then the
    # explicit ones (deterministic coverage of every dimension; reported as they are).
    # max_examples 0: the explicit scenarios only (Hypothesis refuses a zero budget)
    test = kit_settings(max_examples, shrink)(given(sc=scenarios(runner.world_size, space))(check)) \
        if max_examples > 0 else None

    def explicit():
        for e in explicit_scenarios(runner.world_size, space):
            check(e)
    try:
        if test is not None:
            test()
        explicit()
    except Exception as exc:
        if isinstance(runner.error, Unsupported):
            raise runner.error from None
        if state["failing"] is None:  # a replica failure (cached in the runner) or a kit error
            crashed = state.get("crashed")
            text = ("\n".join(getattr(exc, "__notes__", [])) + f"\n{type(exc).__name__}: {exc}" if crashed is None else
                    f"the scenario a replica failed on ({len(crashed.steps)} step(s), world size "
                    f"{crashed.world_size}; not shrunk: a replica failure is re-raised for later examples):\n"
                    f"{json.dumps(crashed.to_json())}\nreproduce: python -m conformance replay SCENARIO.json "
                    f"--ddp {runner.impl} --runtime {runner.runtime}\n{type(exc).__name__}: {exc}")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            corners = crashed.describe_workload() if crashed is not None else ""
            dims = f" ({corners})" if corners else ""
            return [Verdict("", c, "", "", "scenario", runner.world_size, "fail",
                            reason=f"replica failure on a scenario{dims}: {first}", diagnosis=text.strip(),
                            example=None if crashed is None else crashed.to_json())
                    for c in SCENARIO_CHECKS]
        sc, vs = state["failing"]
        out = []
        for v, on in judged_on(sc, vs, *state["first_failing"], worst, state["examples"]):
            if on is None:
                out.append(v)
                continue
            what = "minimal failing" if on is sc and shrink else "failing"
            if on is not sc:
                what += " (unshrunk; the minimal one moved too little to judge this check)"
            v.example = on.to_json()
            v.diagnosis = (f"{what} scenario ({len(on.steps)} step(s), world size {on.world_size}):\n"
                           f"{json.dumps(on.to_json())}\nreproduce: python -m conformance replay SCENARIO.json --ddp "
                           f"{runner.impl} --runtime {runner.runtime}" + (f"\n{v.diagnosis}" if v.diagnosis else ""))
            out.append(v)
        return out
    n = state["examples"]
    unsup = state["unsupported"]
    if unsup and not n:
        raise Unsupported("every scenario: " + "; ".join(f"{why} ({wl})" for why, wl in unsup.items()))
    out = []
    for c in SCENARIO_CHECKS:
        v = worst.get(c) or Verdict("", c, "", "", "scenario", runner.world_size, "pass")
        v.reason = f"{n} scenario(s)" + (f", {state['vacuous']} vacuous (discarded)" if state["vacuous"] else "")
        if state["cells"]:  # docs/transparency.md: the keyword x module/loop map
            v.reason += f"; {len(state['cells'])} of {joint_cells()} keyword x module/loop cells"
        if unsup:  # the corners this implementation lacks, said where the pass is reported
            v.reason += ("; unsupported corner(s) skipped: "
                         + "; ".join(f"{wl}: {why}" for why, wl in list(unsup.items())[:3]))
        if n == state["vacuous"]:
            v.status, v.reason = "vacuous", f"all {n} scenario(s) moved too little to fail"
        out.append(v)
    return out


def evaluate_scenario(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``scenario`` row: its space's scenarios within the session profile's
    budget, or with ``overrides["scenario"]`` that one scenario (``python -m conformance
    replay``); ``overrides["shrink"]``: shrink a failing scenario, default true."""
    agree = lookup(runtime, "scenario", "agreement").atol
    if "scenario" in overrides:  # one given scenario (python -m conformance replay)
        sc = overrides["scenario"]
        results = session.run(runtime, w, scenario_task, timeout=case.timeout, impl=impl, scenario=sc.to_json())
        return None if results is None else judge_scenario(sc, results, scenario_tolerance(runtime, sc),
                                                           agreement_atol=agree)
    runner = SearchRunner(lambda fn, **p: session.run(runtime, w, fn, timeout=case.timeout, **p), runtime, w, impl)
    space = Space(**case.args.get("space", {}))
    rt = get_runtime(runtime)
    # Where each distinct graph is compiled: few shapes, XLA's corners (docs/runtimes/pjrt.md).
    space = replace(space, rank_uniform=space.rank_uniform or rt.uniform_graphs,
                    few_shapes=space.few_shapes or rt.compiled_graphs,
                    xla_corners=space.xla_corners or rt.compiled_graphs)
    # The workload draw has its own budget column (where each distinct graph is compiled, every
    # drawn workload is new graphs: explicit scenarios only by default).
    if space.loop:  # deeper programs under a larger profile
        space = replace(space, max_pattern=loop_depth(session.profile))
    examples = (workload_examples(session.profile, rt.compiled_graphs) if space.workload
                else loop_examples(session.profile, space.budget) if space.loop and rt.compiled_graphs
                else scenario_examples(session.profile, space.budget))
    return run_scenario_case(space, runner, lambda sc: scenario_tolerance(runtime, sc), agree, examples,
                             overrides.get("shrink", True))


def _scenario_problem(case) -> str | None:
    why = space_problem(case.args.get("space", {}))
    return f"scenario space: {why}" if why else None
