"""Replica tasks and judges of the feature cases (the rows, in ``conformance/cases/table.py``, name
them by reference: ``"conformance.cases.task.kind:task_no_sync"``).

A feature case is either a *parity variant* (the standard training loop, judged by the check
table) or a *task* here: a replica task plus a judge that builds
:class:`~conformance.cases.shared.checks.Check` rows on the fly, so the same
:func:`~conformance.cases.shared.checks.judge` (tolerances, vacuity guard, margin) decides.
Semantics mirrored: PyTorch's ``torch/testing/_internal/distributed/distributed_test.py``.
"""
from __future__ import annotations

import numpy as np

from conformance.cases.shared.checks import Check, judge
from conformance.cases.kinds import Kind
from conformance.cases.row import resolve
from conformance.cases.shared.loop import rank_buffer_offset, rank_seed
from conformance.cases.shared.step import construct
from conformance.cases.shared.readback import buffer_layout, flat_buffers, flat_params, param_layout, to_device
from conformance.cases.shared.setups import register_hook
from conformance.tolerances import lookup
from conformance.verdict import Verdict
from conformance.impls.builtin import resolve_impl
from fixtures import build_model, global_batch, shard

SEED = 4321
LOCAL_BATCH = 6
UNEVEN_BASE_STEPS = 3   # replica r trains UNEVEN_BASE_STEPS + r batches under join()


# --- helpers ------------------------------------------------------------------

def replica_model(ctx, model, rank_seeded=True):
    """Model ``model`` on ``ctx.device``, built from the replica's own seed and buffer offset
    (``rank_seeded=False``: rank 0's, on every replica)."""
    r = ctx.rank if rank_seeded else 0
    return to_device(build_model(model, seed=rank_seed(SEED, r), perturb_buffers=rank_buffer_offset(r)),
                     ctx.device)


def _wrap(ctx, impl, module, requires=(), lr=0.0, **kwargs):
    """``module`` built through the step protocol of implementation ``impl`` with ``kwargs`` and
    an ``SGD(lr)``: an :class:`~conformance.cases.shared.step.Engine`; raises Unsupported (see
    :func:`conformance.cases.shared.step.wrap`)."""
    import torch
    engine = construct(resolve_impl(impl), module, ctx, kwargs, lambda params: torch.optim.SGD(params, lr=lr),
                       requires)
    ctx.mark_step()  # XLA: run the construction's collectives before any read-back
    return engine


def _step(engine, x, y, ctx, sync=True):
    """One forward, MSE loss and backward of ``engine`` on ``x``, ``y`` (the step sync unless
    ``sync`` is False: under ``no_sync()``); returns the loss."""
    import torch.nn.functional as F
    loss = F.mse_loss(engine.model(x.to(ctx.device)), y.to(ctx.device))
    engine.backward(loss)
    if sync:
        engine.sync()
    ctx.mark_step()
    return loss


def replica_batch(model, step, world_size, rank):
    """``(x, y, global x, global y)``: replica ``rank``'s shard of step ``step``'s global batch."""
    x, y = global_batch(model, SEED, step, LOCAL_BATCH * world_size)
    return shard(x, rank, world_size), shard(y, rank, world_size), x, y


def _grads(module, engine=None, synced=True):
    """Gradients as one float64 vector (where ``engine``'s strategy keeps them, else ``.grad``;
    ``synced``: see :meth:`~conformance.cases.shared.step.Engine.grads`); a ``None`` gradient
    reads as NaN."""
    import torch
    grads = engine.grads(module, synced) if engine is not None else [p.grad for p in module.parameters()]
    return torch.cat([(g if g is not None else torch.full_like(p, float("nan")))
                      .detach().double().cpu().reshape(-1) for p, g in zip(module.parameters(), grads)]).numpy()


def _grads_none(module, engine=None, synced=True):
    """``[N]`` bool: True on the values of a parameter whose gradient (read as :func:`_grads`
    reads it) is ``None``, not a NaN one."""
    grads = engine.grads(module, synced) if engine is not None else [p.grad for p in module.parameters()]
    return np.concatenate([np.full(p.numel(), g is None) for p, g in zip(module.parameters(), grads)])


def _judge(name, results, expected, impl, runtime, model, tol, movement, per_rank=False):
    """Verdict for ``results[r][name]`` (``[N]`` per replica) vs ``expected``; the
    tensors are named by ``results[0]["layout"]`` (one observation: no step)."""
    check = Check(name, name, lambda reps, ref: (np.stack([r[name][None] for r in reps]),
                                                 expected[:, None] if per_rank else expected[None]),
                  lambda t: (t.atol, t.rtol), movement=lambda ref: movement,
                  layout=lambda reps: reps[0].get("layout"), when="once", nan_is_absent=True,
                  absent=lambda reps: np.stack([r[name + "_none"][None] for r in reps])
                  if name + "_none" in reps[0] else None)
    return judge(check, results, {}, tol, case="", impl=impl, runtime=runtime, model=model)


# --- module-state sync at construction ---------------------------------------

def task_state_sync(ctx, impl):
    m = replica_model(ctx, "batchnorm")
    before = np.concatenate([flat_params(m), flat_buffers(m)])
    engine = _wrap(ctx, impl, m)
    with engine.full_params(m):
        return {"before": before, "after": np.concatenate([flat_params(m), flat_buffers(m)]),
                "layout": param_layout(m) + buffer_layout(m)}


def judge_state_sync(results, impl, runtime):
    ref0 = results[0]["before"]
    spread = max(float(np.max(np.abs(r["before"] - ref0))) for r in results)
    return [_judge("state_sync", [{"state_sync": r["after"], "layout": r["layout"]} for r in results], ref0,
                   impl, runtime, "batchnorm", lookup(runtime, "*", "exact"), spread)]


# --- broadcast_buffers=True: rank 0's edit reaches every replica at forward --

def task_buffers_on(ctx, impl):
    import torch
    m = replica_model(ctx, "batchnorm", rank_seeded=False)
    engine = _wrap(ctx, impl, m, broadcast_buffers=True)
    bn = m[1]
    bn.momentum = 0.0  # forward then leaves running stats as they were broadcast
    with torch.no_grad():
        if ctx.rank == 0:
            bn.running_mean.add_(1.0)
            bn.running_var.mul_(2.0)
    ctx.mark_step()  # XLA: the rank-0-only edit must not be in the forward's (collective) graph
    x, _, _, _ = replica_batch("batchnorm", 0, ctx.world_size, ctx.rank)
    engine.before_forward()
    engine.model(x.to(ctx.device))
    ctx.mark_step()
    return {"buffers": torch.cat([bn.running_mean, bn.running_var]).double().cpu().numpy(),
            "layout": [(f"1.{n}", tuple(getattr(bn, n).shape)) for n in ("running_mean", "running_var")]}


def judge_buffers_on(results, impl, runtime):
    ref0 = results[0]["buffers"]
    return [_judge("buffers", results, ref0, impl, runtime, "batchnorm",
                   lookup(runtime, "*", "exact"), 1.0)]


# --- unused parameters (find_unused_parameters=True) -------------------------

def task_unused(ctx, impl):
    import torch.nn.functional as F
    m = replica_model(ctx, "unused")
    engine = _wrap(ctx, impl, m, requires=("find_unused_parameters",), find_unused_parameters=True)
    x, y, _, _ = replica_batch("unused", 0, ctx.world_size, ctx.rank)
    engine.before_forward()
    engine.backward(F.mse_loss(engine.model(x.to(ctx.device), use_branch=ctx.rank == 0), y.to(ctx.device)))
    engine.sync()
    ctx.mark_step()
    return {"grads": _grads(m, engine), "grads_none": _grads_none(m, engine), "layout": param_layout(m)}


def _unused_reference(world_size):
    import torch.nn.functional as F

    m = build_model("unused", seed=SEED)
    x, y = global_batch("unused", SEED, 0, LOCAL_BATCH * world_size)
    loss = sum(F.mse_loss(m(shard(x, r, world_size), use_branch=r == 0), shard(y, r, world_size))
               for r in range(world_size)) / world_size
    loss.backward()
    return _grads(m)


def judge_unused(results, impl, runtime):
    w = len(results)
    ref = _unused_reference(w)
    tol = lookup(runtime, "unused")
    # NaN marks a None gradient: "never" must stay None, every other must match.
    return [_judge("grads", results, ref, impl, runtime, "unused", tol,
                   float(np.nanmax(np.abs(ref))))]


# --- no_sync -----------------------------------------------------------------

def task_no_sync(ctx, impl):
    m = replica_model(ctx, "linear")
    engine = _wrap(ctx, impl, m, requires=("no_sync",))
    xa, ya, _, _ = replica_batch("linear", 0, ctx.world_size, ctx.rank)
    xb, yb, _, _ = replica_batch("linear", 1, ctx.world_size, ctx.rank)
    engine.before_forward()
    with engine.model.no_sync():
        _step(engine, xa, ya, ctx, sync=False)
    inside, inside_none = _grads(m, engine, synced=False), _grads_none(m, engine, synced=False)
    _step(engine, xb, yb, ctx)
    return {"inside": inside, "inside_none": inside_none, "after": _grads(m, engine),
            "after_none": _grads_none(m, engine), "layout": param_layout(m)}


def _local_grads(model, step, world_size):
    import torch.nn.functional as F

    out = []
    for r in range(world_size):
        m = build_model(model, seed=SEED)
        x, y, _, _ = replica_batch(model, step, world_size, r)
        F.mse_loss(m(x), y).backward()
        out.append(_grads(m))
    return np.stack(out)


def judge_no_sync(results, impl, runtime):
    w = len(results)
    ga, gb = _local_grads("linear", 0, w), _local_grads("linear", 1, w)
    tol = lookup(runtime, "linear")
    # Inside no_sync each replica keeps its own gradient; the check is only
    # meaningful if those differ across replicas.
    spread = float(np.max(np.abs(ga - ga[0])))
    after = (ga + gb).mean(axis=0)
    return [_judge("inside", results, ga, impl, runtime, "linear", tol, spread, per_rank=True),
            _judge("after", results, after, impl, runtime, "linear", tol, float(np.max(np.abs(after))))]


# --- uneven inputs with join() -----------------------------------------------

def task_join(ctx, impl, lr=0.1):
    m = replica_model(ctx, "linear")
    engine = _wrap(ctx, impl, m, requires=("join",), lr=lr)
    with engine.model.join():
        for step in range(UNEVEN_BASE_STEPS + ctx.rank):
            x, y, _, _ = replica_batch("linear", step, ctx.world_size, ctx.rank)
            engine.zero_grad()
            engine.before_forward()
            _step(engine, x, y, ctx)
            engine.step()
            ctx.mark_step()
    with engine.full_params(m):
        return {"params": flat_params(m).astype(np.float64), "layout": param_layout(m)}


def _join_reference(world_size, lr=0.1):
    """Upstream join semantics (divide_by_initial_world_size=True): at a step
    where only some replicas still have data, the gradient is the sum of theirs
    divided by the initial world size."""
    import torch
    import torch.nn.functional as F

    m = build_model("linear", seed=SEED)
    start = flat_params(m).astype(np.float64)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for step in range(UNEVEN_BASE_STEPS + world_size - 1):
        opt.zero_grad(set_to_none=True)
        active = [r for r in range(world_size) if step < UNEVEN_BASE_STEPS + r]
        loss = 0.0
        for r in active:
            x, y, _, _ = replica_batch("linear", step, world_size, r)
            loss = loss + F.mse_loss(m(x), y) / world_size
        loss.backward()
        opt.step()
    end = flat_params(m).astype(np.float64)
    return end, float(np.max(np.abs(end - start)))


def judge_join(results, impl, runtime):
    ref, moved = _join_reference(len(results))
    return [_judge("params", results, ref, impl, runtime, "linear", lookup(runtime, "linear"), moved)]


# --- PowerSGD comm hook: its contract without parity ------------------------

POWERSGD_STEPS = 12       # SGD steps on one fixed global batch
POWERSGD_START_ITER = 2   # PowerSGDState's smallest start with error feedback / warm start
POWERSGD_MIN_DROP = 0.5   # the loss must fall by >= this share of the exact DDP's fall


def task_powersgd(ctx, impl, lr=0.1):
    """torch's ``powerSGD_hook`` (rank 1, compressed from step ``POWERSGD_START_ITER``) registered;
    ``POWERSGD_STEPS`` SGD steps on the replica's shard of one fixed global batch of ``linear``.
    Returns the parameters after each step (float64 ``[steps, P]``) and the local loss before the
    first and after the last step."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    m = replica_model(ctx, "linear")
    engine = _wrap(ctx, impl, m, requires=("register_comm_hook",), lr=lr)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                   start_powerSGD_iter=POWERSGD_START_ITER)
    register_hook(engine.model, impl, powersgd.powerSGD_hook, state)
    x, y, _, _ = replica_batch("linear", 0, ctx.world_size, ctx.rank)
    x, y = x.to(ctx.device), y.to(ctx.device)
    losses, params = [], []
    for _ in range(POWERSGD_STEPS):
        engine.zero_grad()
        engine.before_forward()
        loss = _step(engine, x, y, ctx)
        engine.step()
        ctx.mark_step()
        losses.append(float(loss.detach().cpu()))
        with engine.full_params(m):
            params.append(flat_params(m).astype(np.float64))
    with torch.no_grad():
        last = float(F.mse_loss(m(x), y).cpu())
    with engine.full_params(m):
        shapes = param_layout(m)
    return {"params": np.stack(params), "first": losses[0], "last": last, "layout": shapes,
            "compressed": state.iter > POWERSGD_START_ITER}


def _exact_drop(world_size, lr=0.1):
    """The replica-averaged loss drop of exact DDP (full-batch SGD on one device) over the
    same steps: the scale the PowerSGD run's drop is held to."""
    import torch
    import torch.nn.functional as F
    m = build_model("linear", seed=SEED)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    _, _, x, y = replica_batch("linear", 0, world_size, 0)
    with torch.no_grad():
        first = float(F.mse_loss(m(x), y))
    for _ in range(POWERSGD_STEPS):
        opt.zero_grad(set_to_none=True)
        F.mse_loss(m(x), y).backward()
        opt.step()
    with torch.no_grad():
        return first - float(F.mse_loss(m(x), y))


def judge_powersgd(results, impl, runtime):
    """``agreement``: every replica's parameters bit-identical to replica 0's after every step
    (PowerSGD's factors are seeded alike and all-reduced, so replicas apply one update);
    ``loss_decrease``: the replica-averaged loss falls by >= ``POWERSGD_MIN_DROP`` of exact DDP's
    fall. Parity is not judged: PowerSGD is a lossy, rank-1 approximation (Vogels et al., 2019)."""
    ref0 = results[0]["params"]
    moved = float(np.max(np.abs(ref0[-1] - ref0[0])))
    agree = _judge("agreement", [{"agreement": r["params"].reshape(-1), "layout": None} for r in results],
                   ref0.reshape(-1), impl, runtime, "linear", lookup(runtime, "*", "agreement"), moved)
    w = len(results)
    drop = float(np.mean([r["first"] - r["last"] for r in results]))
    want = POWERSGD_MIN_DROP * _exact_drop(w)
    base = dict(case="", check="loss_decrease", impl=impl, runtime=runtime, model="linear", world_size=w)
    if not all(r["compressed"] for r in results):
        return [agree, Verdict(**base, status="vacuous", reason="PowerSGD never compressed a step")]
    ok = drop >= want
    # a lower bound on a fall, not a deviation under a bound: the columns stay empty, the margin
    # is fall / required fall (>= 1 passes) and the reason gives both numbers
    nan = float("nan")
    return [agree, Verdict(**base, status="pass" if ok else "fail", max_dev=nan, atol=nan,
                           margin=drop / want if want > 0 else nan,
                           reason=f"the replica-averaged loss fell by {drop:.3g}, "
                           f"{'at least' if ok else 'less than'} {POWERSGD_MIN_DROP} x exact DDP's fall ({want:.3g})")]


# --- the task kind ------------------------------------------------------------

def evaluate_task(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``task`` row: its task on every replica, then its judge (one verdict
    per check the row declares, in that order)."""
    results = session.run(runtime, w, resolve(case.task), timeout=case.timeout, impl=impl, **case.args)
    if results is None:
        return None
    verdicts = resolve(case.judge)(results, impl, runtime)
    got = [v.check for v in verdicts]
    assert got == list(case.checks), f"{case.name}: judge gave checks {got}, the row declares {case.checks}"
    return verdicts


def _task_problem(case) -> str | None:
    if case.task is None or case.judge is None:
        return "a task case needs task and judge"
    for column in ("task", "judge"):
        ref = getattr(case, column)
        try:
            fn = resolve(ref)
        except (ImportError, AttributeError, ValueError) as exc:
            return f"{column} {ref!r} names nothing: {type(exc).__name__}: {exc}"
        if not callable(fn):
            return f"{column} {ref!r} is not callable"
    return None


KIND = Kind("task", evaluate_task, validate=_task_problem)
