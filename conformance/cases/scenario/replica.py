"""The replica side of a scenario: the world task :func:`scenario_task` (the scenario model, its
data, the DDP keywords the scenario holds) and the model-agnostic loop :func:`run_loop` it runs,
which the loop programs on a user's model share (:mod:`.userloop`)."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from conformance.cases.scenario.dimensions import (BadBatch, BRANCHES, CLIP_NORM, EVAL_DATA, FORWARD_DATA, TEACHER_SALT,
                                                   XLA_UNSUPPORTED_LOOP, grad_mode, prediction_of, workload_corners,
                                                   xla_unsupported)
from conformance.cases.scenario.format import DDP_DEFAULTS, Scenario
from conformance.cases.scenario.model import build_scenario_model, scenario_inputs, user_grad_hook
from conformance.cases.scenario.oracle import distilled_target, eval_values
from conformance.cases.scenario.statements import (after_step, around_forward, before_wrap, between, optimized,
                                                   refusal, rewrap)
from conformance.cases.shared.setups import register_hook
from conformance.cases.shared.loop import build_optimizer, mse, rank_buffer_offset, rank_seed
from conformance.cases.shared.step import PERFORMANCE_HINTS, construct
from conformance.cases.shared.readback import (buffer_layout, flat_buffers, flat_optimizer_state, flat_params,
                                               optimizer_state_dict,
                                               optimizer_state_layout, param_layout, saved_checkpoint,
                                               state_digest, to_device)
from conformance.cases.shared.transparency import merged, observed_wrap
from conformance.errors import Unsupported
from conformance.impls.builtin import resolve_impl
from ddp_impl.outputs import output_tensors


def scenario_task(ctx, *, impl: str, scenario: dict) -> dict:
    """World task: run ``scenario`` on this replica with implementation ``impl``.

    Returns ``params`` float32 ``[S+1, P]``, ``buffers`` float64 ``[S+1, B]`` (after construction
    and after each optimizer step), ``optim_digests``, ``optim``, ``layout`` and ``transparency``
    as :func:`conformance.cases.shared.loop.train_replica` gives them.

    Raises:
        Unsupported: the implementation refuses a keyword or lacks no_sync /
            register_comm_hook.
    """
    sc = Scenario.from_json(scenario)
    row = resolve_impl(impl)
    if row.forward_backward is not None or row.make_optimizer is not None:
        raise Unsupported(f"{impl} brings its own {'compiled step' if row.forward_backward else 'optimizer'}, "
                          "which the scenario loop (its own optimizers, micro-steps) would bypass")
    kwargs, requires, optional = _ddp_keywords(sc)
    _refuse_on_xla(ctx, sc)
    build = _builder(ctx, row, sc, kwargs, requires, optional)
    try:
        built = build()
    except NotImplementedError as exc:  # a library's refusal of a corner at construction (same on every replica)
        what = "; ".join(filter(None, [f"workload {workload_corners(sc.workload)}" if workload_corners(sc.workload)
                                       else "", refusal(sc.loop)]))
        if not what:
            raise
        raise Unsupported(f"{impl} refuses {what}: NotImplementedError: {exc}") from None
    which = row.shard_rank(ctx)
    return run_loop(ctx, row, sc, built, build,
                    lambda s, j, sizes, plan: scenario_inputs(sc, s, j, which, sizes, plan, ctx.device),
                    lambda out, y: mse(prediction_of(out), y), blend=distilled_target)


def _ddp_keywords(sc: Scenario) -> tuple:
    """``(kwargs, requires, optional)``: the DDP keywords ``sc`` passes, those (and the methods)
    it requires the implementation to honour, and those it may drop where refused."""
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
    if sc.topology is not None:  # the graph is what is tested: a DDP without buckets or static_graph still runs it
        optional += PERFORMANCE_HINTS + ("static_graph",)
    requires = [k for k in kwargs if k != "broadcast_buffers" and k not in optional]
    if any(not sc.synced(s, j) for s in range(len(sc.steps)) for j in range(len(sc.steps[s]["micro"]))):
        requires.append("no_sync")
    if sc.ddp.get("comm_hook"):
        requires.append("register_comm_hook")
    return kwargs, requires, optional


def _refuse_on_xla(ctx, sc: Scenario) -> None:
    """Raise :class:`~conformance.errors.Unsupported` for a corner an XLA device cannot train."""
    why = xla_unsupported(sc.workload) if str(ctx.device).startswith("xla") else None
    if sc.topology is not None and str(ctx.device).startswith("xla"):
        why = "generated topologies are drawn on CPU only (each drawn graph would be a new compilation)"
    if why:
        raise Unsupported(f"workload {workload_corners(sc.workload)}: {why}")
    if str(ctx.device).startswith("xla") and any(f["grad"] == "inference_mode" for st in sc.steps
                                                 for f in st.get("eval", ())):
        raise Unsupported(XLA_UNSUPPORTED_LOOP[("eval", "inference_mode")])


def _builder(ctx, row, sc: Scenario, kwargs: dict, requires: list, optional: tuple):
    """``build(salt=0, module=None, optimizer=None)`` -> ``(module, engine, observer)``: this
    replica's scenario model built and wrapped (:func:`wrap_engine`), its gradient hook and comm
    hook; with ``module``: that module wrapped again in a new DDP with ``optimizer`` (a statement's
    re-wrap, :func:`.statements.rewrap`)."""
    r = ctx.rank
    # init_sync=False: the user builds equal parameters (rank 0's seed); buffers stay each replica's
    owner = r if sc.ddp.get("init_sync", True) else 0

    def build(salt=0, module=None, optimizer=None):  # replica r from its own seed and ema offset
        m = module
        if m is None:  # only a DDP that broadcasts matches
            m = to_device(build_scenario_model(rank_seed(sc.seed, owner, salt), sc.rebind_buffers,
                                               rank_buffer_offset(r, salt), sc.workload, sc.module, sc.topology),
                          ctx.device)
            before_wrap(sc.loop, m)
        engine, obs = wrap_engine(ctx, row, sc, m, kwargs, requires, optional, optimizer)
        if module is None:  # the user's hook is the module's: a second wrap keeps it
            user_grad_hook(m, sc.module)
        if sc.ddp.get("comm_hook"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            register_hook(engine.model, row.name, default_hooks.allreduce_hook)
        ctx.mark_step()
        return m, engine, obs
    return build


def wrap_engine(ctx, row, sc: Scenario, module, kwargs: dict, requires, optional=(), optimizer=None):
    """``(engine, observer)``: ``module`` wrapped (observed) through ``row``'s step protocol with
    ``kwargs`` (:class:`~conformance.cases.shared.step.Engine`) and the scenario's optimizer over
    the parameters the statements give it (:func:`.statements.optimized`), or ``optimizer`` (a
    module wrapped again keeps the user's)."""
    def make(params):
        return optimizer if optimizer is not None else build_optimizer(sc.optimizer, optimized(sc.loop, params), sc.lr)
    return observed_wrap(row, module, ctx, lambda: construct(row, module, ctx, kwargs, make, tuple(requires), optional))


def run_loop(ctx, row, sc: Scenario, built, build, inputs, loss, blend=None) -> dict:
    """The model-agnostic replica side of loop program ``sc`` (what :func:`scenario_task` returns),
    with the callables of :func:`.oracle.loop_reference` as this replica sees them: ``built`` the
    ``(module, engine, observer)`` constructed, ``build(salt)`` a new one (the checkpoint
    reload; ``TEACHER_SALT``: the teacher), ``build(module=m, optimizer=opt)`` ``m`` wrapped
    again (:func:`_builder`), ``inputs(s, j, sizes, plan)`` on the device.

    Raises:
        ValueError: the program has a teacher and no ``blend`` was given.
    """
    loop = _ReplicaLoop(ctx, row, sc, built, build, inputs, loss, blend)
    if not loop.training:
        loop.set_mode(False)
    with loop.engine.full_params(loop.model):
        params, buffers, digests = [flat_params(loop.model)], [flat_buffers(loop.model)], []
    for s, step in enumerate(sc.steps):
        loop.engine.zero_grad(set_to_none=sc.loop["zero_grad"] == "set_to_none")
        for group in loop.opt.param_groups:
            group["lr"] = sc.lr_at(s)
        micro = step["micro"]
        loop.engine.before_forward()
        for j, m in enumerate(micro):
            loop.evaluate(s, j)
            loop.micro_step(s, j, m)
            if j < len(micro) - 1:
                ctx.mark_step()
        loop.evaluate(s, len(micro))
        loop.optimizer_step(s)
        after_step(sc.loop, ctx.rank, loop.ddp)
        with loop.engine.full_params(loop.model):
            params.append(flat_params(loop.model))
        buffers.append(flat_buffers(loop.model))
        digests.append(state_digest(flat_optimizer_state(loop.opt, loop.full_state())))
        unfrozen = rewrap(sc.loop, s, loop.model)
        if unfrozen is not None:
            loop.rewrap(unfrozen)
        if sc.checkpoint_at == s:
            loop.reload()
    model, opt, final = loop.model, loop.opt, loop.full_state()
    with loop.engine.full_params(model):
        shapes = param_layout(model)
    layout = {"params": shapes, "buffers": buffer_layout(model),
              "optim": optimizer_state_layout(opt, final, model)}
    # read once the steps are done: on XLA a read mid-step would cut and compile each replica's graph apart
    vals = [eval_values(out) for out in loop.evals]
    layout["evals"] = [(what, (v.size,)) for what, v in zip(loop.eval_layout, vals)]
    evals = np.concatenate(vals) if vals else np.zeros(0)
    return {"params": np.stack(params), "buffers": np.stack(buffers), "optim_digests": digests,
            "optim": flat_optimizer_state(opt, final), "evals": evals, "layout": layout,
            "transparency": merged(loop.observers)}


class _ReplicaLoop:
    """The state of one :func:`run_loop`: the trained ``(model, engine, obs)`` (rebuilt at the
    checkpoint reload; ``ddp`` and ``opt`` the engine's), every wrap's observer, the frozen teacher
    DDP if the program has one."""

    def __init__(self, ctx, row, sc: Scenario, built, build, inputs, loss, blend):
        self.ctx, self.row, self.sc, self.build, self.inputs, self.loss, self.blend = (
            ctx, row, sc, build, inputs, loss, blend)
        self.scale = 2.0 ** sc.loss_scale_log2
        if row.optimizer_first and any(rewrap(sc.loop, s, built[0]) is not None for s in range(len(sc.steps))):
            raise Unsupported(f"{row.name} wraps the optimizer with the model: the program's second wrap of the "
                              f"module would wrap the optimizer again ({refusal(sc.loop)})")
        self._adopt(built)
        self.observers = [self.obs]
        self.evals, self.eval_layout = [], []  # the outputs of the forwards without backward, in order
        self.training = sc.loop["module_mode"] == "train"
        self.teacher = None
        if sc.loop["teacher"] != "none":  # a second DDP in the loop: built after the trained one, never trained
            if blend is None:
                raise ValueError("a loop program with a teacher needs the target's blend")
            t_model, t_engine, t_obs = build(TEACHER_SALT)
            self.teacher = t_engine.model
            t_obs.close()  # never trained: its own wrap was observed, its forwards are not
            (self.teacher if callable(getattr(self.teacher, "train", None)) else t_model).train(False)

    def _adopt(self, built) -> None:
        self.model, self.engine, self.obs = built
        self.ddp, self.opt = self.engine.model, self.engine.opt
        if self.scale != 1.0 or self.sc.loop["clip"] == "norm":
            self.engine.require_grads_in_place("loss unscaling" if self.scale != 1.0 else "gradient clipping")

    def full_state(self):
        """The strategy's full optimizer state dict where it declares one (a collective), else None."""
        return optimizer_state_dict(self.row, self.opt, self.ctx) if self.row.optimizer_state_dict else None

    def set_mode(self, train):  # as a user does: on the wrapper (which sets the module's mode)
        (self.ddp if callable(getattr(self.ddp, "train", None)) else self.model).train(train)

    def record(self, out, what: str) -> None:
        """Keep the output ``out`` of a forward without backward (``what`` names it), detached so
        that a grad-enabled forward's graph is not held until the run ends."""
        self.evals.append(output_tensors(out, torch.Tensor.detach))
        self.eval_layout.append(what)

    def evaluate(self, s: int, at: int):
        """Step ``s``'s forwards without backward before micro-step ``at`` (outputs kept)."""
        ddp, obs = self.ddp, self.obs
        for e, f in self.sc.evals(s, at):
            args, kwargs, _ = self.inputs(s, EVAL_DATA + e, f["batch"], None)
            self.set_mode(f["mode"] == "train")
            with grad_mode(f["grad"]), around_forward(self.sc.loop, ddp, f):
                if f["grad"] != "raising":
                    self.record(obs.call(ddp, *args, **kwargs), f"step {s + 1} forward {e + 1} without backward")
                else:  # a bad batch the loop skips: the module raises after its buffers moved
                    try:
                        obs.call(ddp, *args, **dict(kwargs, bad=True))
                    except BadBatch:
                        pass
            self.set_mode(self.training)
            self.ctx.mark_step()

    def micro_step(self, s: int, j: int, m: dict):
        """Micro-step ``j`` of step ``s`` (under ``no_sync()`` unless synced): its forwards, the
        teacher's blended into the target, and one backward of the scaled summed loss."""
        sc, ddp, obs, inputs = self.sc, self.ddp, self.obs, self.inputs
        plan = tuple(m["plan"][self.row.shard_rank(self.ctx)])
        ctxm = contextlib.nullcontext() if sc.synced(s, j) else ddp.no_sync()
        with ctxm:
            total = 0
            for k in range(sc.forwards(s, j)):  # forwards before the one backward (a GAN's D)
                args, kwargs, y = inputs(s, FORWARD_DATA * k + j, m["batch"], plan)
                if self.teacher is not None:
                    targs, tkwargs, _ = inputs(s, FORWARD_DATA * k + j, m["batch"], None)
                    with torch.no_grad():
                        y = self.blend(self.teacher(*targs, **tkwargs), y)
                out = obs.call(ddp, *args, **kwargs)
                for mode in between(sc.loop):  # a target forward before the backward (pseudo-labels)
                    with grad_mode(mode):
                        self.record(obs.call(ddp, *args, **kwargs),
                                    f"step {s + 1} micro-step {j + 1} forward {k + 1}'s {mode} target forward")
                total = total + self.loss(out, y)
            with obs.unchanged_by("backward"):
                self.engine.backward(total * self.scale)

    def optimizer_step(self, s: int):
        """Step ``s``'s optimizer step: the strategy's after-backward, the gradients unscaled (and
        clipped), the step (the strategy's, or ``optimizer.step()``), observed."""
        obs, ctx, model = self.obs, self.ctx, self.model
        self.engine.sync()
        if self.scale != 1.0:
            with torch.no_grad():
                for q in model.parameters():
                    if q.grad is not None:
                        q.grad.div_(self.scale)
        if self.sc.loop["clip"] == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        with obs.unchanged_by("the optimizer step"):
            self.engine.step()
        ctx.mark_step()
        obs.after_step(s + 1, modes=False)  # the loop sets modes itself (eval forwards)

    def rewrap(self, params):
        """A new DDP around the trained module (``ddp.module``, as a user wraps it again) once
        ``params`` are unfrozen (``requires_grad_(True)``) and added to the optimizer as a new
        group; observed afresh (the user changed ``requires_grad`` between the wraps)."""
        self.obs.close()
        for q in params:
            q.requires_grad_(True)
        self.opt.add_param_group({"params": list(params)})
        self._adopt(self.build(module=self.model, optimizer=self.opt))
        self.observers.append(self.obs)
        if not self.training:
            self.set_mode(False)

    def reload(self):
        """The checkpoint: save DDP + optimizer state, build a new DDP (observed) and load it."""
        model_state, optim_state = saved_checkpoint(self.ddp.state_dict(), self.full_state() or self.opt.state_dict())
        self.obs.close()
        self._adopt(self.build(salt=1))
        self.observers.append(self.obs)
        self.model.load_state_dict(model_state)
        self.opt.load_state_dict(optim_state)
        if not self.training:
            self.set_mode(False)
