"""The single-device oracle of DDP's semantics for a scenario, and the judge comparing replicas with it.

What the oracle computes, on one CPU device, each parameter in its own dtype (the workload's;
the loss float64 for a float64 model); a sparse gradient's replica mean is dense (the same SGD
update as upstream's sparse all-reduce):

* **Gradients.** Each replica's gradients are kept apart; its backwards accumulate into them
  (autograd's ``AccumulateGrad``). A synced backward (the last of an accumulation window, or any
  with ``"sync": true``) replaces every replica's gradient by the replicas' mean (zeros where a
  replica holds ``None``), except a parameter no replica's backward reached since the last synced
  one with ``find_unused_parameters``: torch's reducer leaves its gradient as it is (``None``, a
  zero tensor after ``zero_grad(set_to_none=False)``, or an earlier synced backward's mean); a
  parameter frozen before wrapping is never reduced (torch's reducer holds only the parameters
  that required grad at construction). A parameter unfrozen after wrapping is reduced from the
  next wrap on (a new DDP around the module, :data:`~.statements.STATEMENTS` ``unfreeze``), which
  broadcasts rank 0's buffers at construction and arms its first forward's broadcast.
* **Buffers** (``broadcast_buffers``, ``forward_sync_buffers`` and ``init_sync`` as
  :func:`~.format.buffer_sync` reads them): a forward through the DDP starts from rank 0's buffers
  when the forward sync is on and the previous forward was a synced one with grad enabled, or
  there was none since construction (``torch.nn.parallel.DistributedDataParallel._pre_forward`` /
  ``_post_forward``: ``require_forward_param_sync``, whatever the module's mode): also between two
  forwards before one backward, and after a grad-enabled forward that no backward follows; a
  forward whose module raises (the loop's skipped bad batch) moved the buffers and leaves the flag
  as it was (``_post_forward`` never ran).
* **The module axis** (:data:`~.dimensions.MODULES`): every buffer is broadcast whatever its dtype
  (integer ones too), at construction (``torch/distributed/utils.py`` ``_sync_module_states``) and
  before a forward (``_sync_buffers`` over ``named_buffers()``, re-read each time); without
  ``broadcast_buffers`` each replica keeps its own start (:func:`~.model.seen_start`). Forward
  keywords reach the module unchanged (``DistributedDataParallel.forward(*inputs, **kwargs)``); a
  parametrized weight trains its ``original`` tensors, container-held parameters are module
  parameters like any other.

:func:`loop_reference` is the engine (any module, its own data); :func:`scenario_reference` runs
it on the scenario model, the user loop programs on a user's model (:mod:`.userloop`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from conformance.cases.shared.checks import AGREEMENT, CHECKS, SCENARIO_CHECKS, TRANSPARENCY, judge, judge_agreement
from conformance.cases.shared.transparency import judge_transparency
from conformance.cases.scenario.dimensions import (BadBatch, CLIP_NORM, EVAL_DATA, FORWARD_DATA, TEACHER_SALT,
                                                   grad_mode, prediction_of)
from conformance.cases.scenario.format import Scenario, buffer_sync
from conformance.cases.scenario.statements import after_step, around_forward, before_wrap, between, optimized, rewrap
from conformance.cases.scenario.model import (build_scenario_model, scenario_inputs, seen_start,
                                              user_grad_hook)
from conformance.cases.shared.loop import build_optimizer, mse, rank_buffer_offset, rank_seed
from conformance.cases.shared.readback import flat_optimizer_state, flat_params
from conformance.verdict import Verdict
from ddp_impl.outputs import output_tensors

# --- the oracle -----------------------------------------------------------------------------------

def scenario_reference(sc: Scenario) -> dict:
    """DDP's semantics for ``sc`` on one CPU device (the module docstring), on rank 0's scenario
    model. Returns ``params`` ``[S+1, P]``, ``buffers`` ``[S+1, W, B]`` (what each replica must
    hold after each step), ``optim`` (final optimizer state)."""
    net = build_scenario_model(sc.seed, sc.rebind_buffers, workload=sc.workload, module=sc.module,
                               topology=sc.topology)
    before_wrap(sc.loop, net)
    user_grad_hook(net, sc.module)
    start_buffers, reload_buffers = _scenario_buffers(sc, net)
    teacher = None
    if sc.loop["teacher"] != "none":  # rank 0's parameters (broadcast), in eval mode: its buffers never move,
        # so they are rank 0's once either buffer broadcast ran, else each replica's own
        owner = (lambda r: 0) if any(buffer_sync(sc.ddp)) else (lambda r: r)
        teacher = [build_scenario_model(rank_seed(sc.seed, 0, TEACHER_SALT), sc.rebind_buffers,
                                        rank_buffer_offset(owner(r), TEACHER_SALT), sc.workload, sc.module,
                                        sc.topology).eval() for r in range(sc.world_size)]
    return loop_reference(sc, net, lambda s, j, r, sizes, plan: scenario_inputs(sc, s, j, r, sizes, plan),
                          lambda out, y: mse(prediction_of(out), y), start_buffers, reload_buffers, teacher=teacher,
                          blend=distilled_target)


def _scenario_buffers(sc: Scenario, net) -> tuple:
    """``(start_buffers, reload_buffers)`` of :func:`loop_reference` for the scenario model ``net``."""
    init_synced = buffer_sync(sc.ddp)[0]  # rank 0's buffers at construction
    names = [n for n, _ in net.named_buffers()]

    def start(n, t, r):  # what replica r's own construction gave buffer n (build_scenario_model)
        if init_synced:
            return 0
        return (rank_buffer_offset(r) if t.is_floating_point() else
                seen_start(rank_buffer_offset(r)) if n == "seen" else 0)

    def start_buffers(r):
        return [t.detach().clone() + start(n, t, r) for n, t in net.named_buffers()]

    def reload_buffers(r, bufs):  # after a checkpoint reload: ema, when non-persistent, is the new module's own
        if sc.module["buffers"] != "non_persistent":  # (construction broadcasts rank 0's if init_synced)
            return bufs
        ema = names.index("ema")
        bufs = list(bufs)
        bufs[ema] = torch.zeros_like(bufs[ema]) + rank_buffer_offset(0 if init_synced else r, 1)
        return bufs
    return start_buffers, reload_buffers


def distilled_target(teacher_out, y):
    """The loss's target with a frozen teacher (:data:`~.dimensions.LOOPS` ``teacher``): ``(y + its
    prediction) / 2``."""
    return 0.5 * (y + prediction_of(teacher_out))


def eval_values(out) -> np.ndarray:
    """The floating-point tensors of a forward's output ``out`` (:func:`output_tensors`),
    flattened in order into one float64 vector (complex: real and imaginary parts)."""
    vals = []
    for t in output_tensors(out):
        if t.is_floating_point() or t.is_complex():
            t = t.detach().cpu()
            t = torch.view_as_real(t) if t.is_complex() else t
            vals.append(t.double().reshape(-1).numpy())
    return np.concatenate(vals) if vals else np.zeros(0)


def padded(vectors: list) -> np.ndarray:
    """``[len(vectors), N]``: the 1-D ``vectors`` (each replica's, of its own length where local
    batches are uneven) padded with NaN to the longest (read as absent by ``eval_parity``)."""
    n = max((v.size for v in vectors), default=0)
    out = np.full((len(vectors), n), np.nan)
    for i, v in enumerate(vectors):
        out[i, :v.size] = v
    return out


def loop_reference(sc: Scenario, net, inputs, loss, start_buffers, reload_buffers, teacher=None, blend=None) -> dict:
    """The model-agnostic oracle of loop program ``sc`` (semantics: the module docstring) on module
    ``net`` (rank 0's, as the DDP broadcasts it at construction), which it trains, with the
    caller's data (the scenario model's, :func:`scenario_reference`, or a user's, :mod:`.userloop`):
    ``inputs(s, j, r, sizes, plan)`` -> ``(args, kwargs, target)`` of replica ``r``'s forward on
    micro-batch ``(s, j)`` (``j >= EVAL_DATA``: a forward without backward, ``plan`` None),
    ``loss(out, target)`` each replica's scalar, ``start_buffers(r)`` / ``reload_buffers(r,
    buffers)`` replica ``r``'s buffers after construction / after the checkpoint reload.
    ``teacher``: each replica's frozen teacher module (a list by rank; eval mode, rank 0's
    parameters) whose ``no_grad`` prediction ``blend(prediction, target)`` mixes into each
    training forward's target; it leaves the trained DDP's buffer rule alone (torch keeps
    ``require_forward_param_sync`` per instance)."""
    run = _LoopOracle(sc, net, inputs, loss, start_buffers, teacher, blend)
    out_p = [flat_params(net)]
    out_b = [run.flat_bufs()]
    for s, step in enumerate(sc.steps):
        micro = step["micro"]
        run.begin_step(s)
        for j, m in enumerate(micro):
            run.evaluate(s, j)
            run.micro_step(s, j, m)
        run.evaluate(s, len(micro))
        run.optimizer_step()
        after_step(sc.loop, 0, net)
        out_p.append(flat_params(net))
        out_b.append(run.flat_bufs())
        unfrozen = rewrap(sc.loop, s, net)
        if unfrozen is not None:
            run.rewrap(unfrozen)
        if sc.checkpoint_at == s:
            run.reload(reload_buffers)
    evals = padded([np.concatenate(e) if e else np.zeros(0) for e in run.evals])
    return {"params": np.stack(out_p), "buffers": np.stack(out_b), "optim": flat_optimizer_state(run.opt),
            "evals": evals}


class _LoopOracle:
    """The state of one :func:`loop_reference` run: every replica's gradients (``grads``) and
    buffers (``rank_bufs``), loaded into the one module ``net`` in turn, and the DDP's
    ``require_forward_param_sync`` flag (``sync_next``)."""

    def __init__(self, sc: Scenario, net, inputs, loss, start_buffers, teacher, blend):
        self.sc, self.net, self.inputs, self.loss, self.teacher, self.blend = sc, net, inputs, loss, teacher, blend
        self.w = w = sc.world_size
        self.lp = sc.loop
        self.training = self.lp["module_mode"] == "train"
        self.opt = build_optimizer(sc.optimizer, optimized(sc.loop, net.parameters()), sc.lr)
        self.scale = 2.0 ** sc.loss_scale_log2
        self.params = params = list(net.parameters())
        self.find_unused = bool(sc.ddp.get("find_unused_parameters"))
        self.forward_synced = buffer_sync(sc.ddp)[1]  # rank 0's buffers before a forward
        self.names = [n for n, _ in net.named_buffers()]
        self.rank_bufs = [start_buffers(r) for r in range(w)]
        self.evals = [[] for _ in range(w)]  # each replica's outputs of forwards without backward
        self.grads = [[None] * len(params) for _ in range(w)]  # each replica's .grad
        self.reached = [False] * len(params)  # some replica's backward reached it since the last synced one
        self._watch(q for q in params if q.requires_grad)  # a parameter frozen before wrapping is not the reducer's
        self.sync_next = True  # require_forward_param_sync: construction counts as a synced forward

    def _watch(self, chosen) -> None:
        """Mark ``reached`` when a backward accumulates into one of the ``chosen`` parameters."""
        reached, index = self.reached, {id(q): i for i, q in enumerate(self.params)}
        for q in chosen:
            q.register_post_accumulate_grad_hook(lambda _, i=index[id(q)]: reached.__setitem__(i, True))

    def set_bufs(self, vals):
        for n, v in zip(self.names, vals):
            owner, _, leaf = n.rpartition(".")
            setattr(self.net.get_submodule(owner) if owner else self.net, leaf, v.clone())

    def get_bufs(self):
        return [t.detach().clone() for t in self.net.buffers()]

    def flat_bufs(self):
        return np.stack([np.concatenate([t.double().reshape(-1).numpy() for t in rb]) if rb else np.zeros(0)
                         for rb in self.rank_bufs])

    def forward(self, r, s, j, sizes, plan, mode, raising=False):
        """Replica ``r``'s forward on micro-batch ``(s, j)`` through the DDP's buffer semantics
        (``raising``: the scenario model's bad batch, which raises after its buffers moved)."""
        args, kwargs, y = self.inputs(s, j, r, sizes, plan)
        self.set_bufs(self.rank_bufs[r])
        self.net.train(mode)
        out = None
        try:
            out = self.net(*args, **(dict(kwargs, bad=True) if raising else kwargs))
        except BadBatch:
            if not raising:
                raise
        self.rank_bufs[r] = self.get_bufs()
        return out, y

    def begin_forwards(self):
        if self.forward_synced and self.sync_next:
            for r in range(1, self.w):
                self.rank_bufs[r] = [t.clone() for t in self.rank_bufs[0]]

    def begin_step(self, s: int):
        """``optimizer.zero_grad`` on every replica, and step ``s``'s learning rate."""
        for r in range(self.w):
            self.grads[r] = [None if g is None or self.lp["zero_grad"] == "set_to_none" else torch.zeros_like(g)
                             for g in self.grads[r]]
        for g in self.opt.param_groups:
            g["lr"] = self.sc.lr_at(s)

    def evaluate(self, s: int, at: int):
        """Step ``s``'s forwards without backward before micro-step ``at``."""
        for e, f in self.sc.evals(s, at):
            self.begin_forwards()
            for r in range(self.w):
                with grad_mode(f["grad"]), around_forward(self.sc.loop, self.net, f):
                    out, _ = self.forward(r, s, EVAL_DATA + e, f["batch"], None, f["mode"] == "train",
                                          raising=f["grad"] == "raising")
                    if f["grad"] != "raising":
                        self.evals[r].append(eval_values(out))
            if f["grad"] != "raising":  # a raising forward never reaches _post_forward: flag kept
                # outside no_sync(): a grad-enabled forward counts as a synced one
                self.sync_next = f["grad"] == "enabled"

    def micro_step(self, s: int, j: int, m: dict):
        """Micro-step ``j`` of step ``s``: its forwards on every replica, each replica's backward
        into its own gradients, and the replicas' mean when it is synced."""
        sc, w = self.sc, self.w
        synced = sc.synced(s, j)
        losses = [0] * w
        for k in range(sc.forwards(s, j)):  # each forward starts with the buffer rule
            self.begin_forwards()
            outs = []
            for r in range(w):
                out, y = self.forward(r, s, FORWARD_DATA * k + j, m["batch"], tuple(m["plan"][r]), self.training)
                if self.teacher is not None:
                    targs, tkwargs, _ = self.inputs(s, FORWARD_DATA * k + j, r, m["batch"], None)
                    with torch.no_grad():
                        y = self.blend(self.teacher[r](*targs, **tkwargs), y)
                outs.append((out, y))
            self.sync_next = synced  # a grad-enabled forward, inside no_sync() or not
            for mode in between(self.lp):  # a target forward before the backward: the buffer rule, no reducer
                self.begin_forwards()
                for r in range(w):
                    with grad_mode(mode):
                        t, _ = self.forward(r, s, FORWARD_DATA * k + j, m["batch"], tuple(m["plan"][r]),
                                            self.training)
                    self.evals[r].append(eval_values(t))
                self.sync_next = False  # a forward without grad
            for r, (out, y) in enumerate(outs):
                losses[r] = losses[r] + self.loss(out, y)
        params, grads = self.params, self.grads
        for r in range(w):
            for i, q in enumerate(params):  # a copy: AccumulateGrad may add in place
                q.grad = None if grads[r][i] is None else grads[r][i].clone()
            (losses[r] * self.scale).backward()
            # a sparse gradient's replica mean is taken dense
            grads[r] = [None if q.grad is None else q.grad.to_dense() if q.grad.is_sparse else q.grad
                        for q in params]
        if synced:
            self.all_reduce()

    def all_reduce(self):
        """A synced backward: every replica's gradient becomes the replicas' mean (but a parameter
        no replica reached, with ``find_unused_parameters``)."""
        params, grads, w = self.params, self.grads, self.w
        for i in range(len(params)):
            if not params[i].requires_grad or (self.find_unused and not self.reached[i]):
                continue  # frozen at wrap (not the reducer's), or no replica reached it since the last synced one
            total = None
            for r in range(w):  # the replicas' gradients, zeros where None, in rank order
                g = grads[r][i] if grads[r][i] is not None else torch.zeros_like(params[i])
                total = g.clone() if total is None else total + g
            for r in range(w):
                grads[r][i] = total / w
        self.reached[:] = [False] * len(params)

    def optimizer_step(self):
        """Replica 0's gradients, unscaled (and clipped), through the optimizer; every replica
        keeps the step's gradients."""
        params = self.params
        with torch.no_grad():
            for i, q in enumerate(params):
                q.grad = None if self.grads[0][i] is None else self.grads[0][i] / self.scale
        if self.lp["clip"] == "norm":
            torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        self.opt.step()
        for r in range(self.w):  # the step's gradients, unscaled (and clipped), as on every replica
            self.grads[r] = [None if q.grad is None else q.grad.clone() for q in params]

    def reload(self, reload_buffers):
        """The checkpoint reload: a new DDP (its first forward broadcasts), no gradients, each
        replica's buffers as :func:`loop_reference`'s ``reload_buffers`` gives them."""
        self.sync_next = True  # a new DDP: its first forward broadcasts
        self.grads = [[None] * len(self.params) for _ in range(self.w)]  # a state dict holds no gradients
        self.rank_bufs = [reload_buffers(r, self.rank_bufs[r]) for r in range(self.w)]

    def rewrap(self, params):
        """A new DDP around the module with ``params`` unfrozen (``requires_grad_(True)``) and added to
        the optimizer as a new group: its construction broadcasts rank 0's buffers (parameters are
        equal), its first forward broadcasts them again, its reducer holds ``params`` too."""
        for q in params:
            q.requires_grad_(True)
        self.opt.add_param_group({"params": list(params)})
        self._watch(params)
        if buffer_sync(self.sc.ddp)[0]:
            self.rank_bufs = [[t.clone() for t in self.rank_bufs[0]] for _ in range(self.w)]
        self.sync_next = True


# --- the judge ------------------------------------------------------------------------------------

def judge_scenario(sc: Scenario, results: list, tol, *, agreement_atol: float = 0.0, ref: dict | None = None,
                   model: str = "scenario") -> list[dict]:
    """One :class:`~conformance.verdict.Verdict` per check of
    :data:`~conformance.cases.shared.checks.SCENARIO_CHECKS` (case and implementation fields left for
    the caller): every replica against the oracle's result ``ref`` (default:
    :func:`scenario_reference`'s), and replica agreement; ``model`` the verdicts' model."""
    ref = scenario_reference(sc) if ref is None else ref
    out = []
    for name, row in SCENARIO_CHECKS.items():
        if name == AGREEMENT:
            out.append(judge_agreement(results, case="", impl="", runtime="", model=model, atol=agreement_atol))
            continue
        if name == TRANSPARENCY:
            out.append(judge_transparency(results, model=model))
            continue
        if name == "eval_outputs" and not ref["evals"].shape[-1]:
            out.append(Verdict("", name, "", "", model, len(results), "skip",
                               reason="the program has no forward without backward: no output to compare"))
            continue
        v = judge(replace(CHECKS[row], name=name), results, ref, tol, case="", impl="", runtime="", model=model)
        if name == "optimizer_state":
            if v.status == "vacuous" and not ref["optim"].size:
                v.status, v.reason = "pass", "the optimizer keeps no state (plain SGD): nothing to compare"
        out.append(v)
    for v in out:  # the dimensions in play at the failing step first (the table shows the first sentence)
        if v.status == "fail" and v.first_bad_step:
            s = min(v.first_bad_step, len(sc.steps)) - 1
            dims = sc.describe_step(s, config=False)
            v.reason = (f"step {s + 1} of {len(sc.steps)}{f' ({dims})' if dims else ''}: {v.reason} "
                        f"The scenario runs optimizer {sc.optimizer}, DDP keywords {sc.ddp} (as drawn: an "
                        f"optional or performance-only keyword the DDP refused was left out).")
    return out
