"""World tasks of the throughput benchmark (``bench_throughput.py``).

:func:`bench_task` runs on every replica of a :class:`conformance.worlds.spawned.World`:
it builds the model, wraps it (or not, for the floor), trains ``warmup``
untimed steps, meets the other replicas at a barrier, then times ``steps``
steps with :func:`time.perf_counter` and returns the timings as plain Python
numbers. Variants:

* an implementation spec of :mod:`conformance.impls.builtin` (``ref``, ``torch``,
  ``xla_recipe`` when the table has it, ``package.module:Class``), built with
  ``ddp_kwargs`` only (each implementation's defaults otherwise, not the
  model table's test settings such as ``bucket_cap_mb=1``): the same
  loop as the train cases (conformance.cases.shared.loop) - ``zero_grad``, forward, MSE loss, backward,
  the implementation's ``after_backward`` hook if any, ``SGD.step``,
  ``ctx.mark_step()``;
* ``floor:local``: that loop on the bare module (no DDP, no gradient sync);
* ``floor:allreduce``: one all-reduce (with the ``1/W`` mean scale) of a flat
  float32 buffer as large as all gradients together, then ``ctx.mark_step()``;
* ``floor:fused`` (informative): ``floor:local`` with that all-reduce issued
  between backward and the optimizer step of the same step (the floor's
  communication inside a real step, with no gradient copies and no overlap).

The floor of a synchronous data-parallel step is ``floor:local`` +
``floor:allreduce``: the local work plus the least communication any DDP must
do (one all-reduce of every gradient, no overlap).

With ``profile=True`` the replica's collectives are wrapped in
:class:`TimedCollectives`, which counts the all-reduces the implementation
issues per step, their sizes and (on blocking runtimes) the time spent in them.

Torch is imported inside the tasks only (PJRT hosts must initialise XLA before
any CPU autograd work).
"""
from __future__ import annotations

import dataclasses
import time

# Distinct batches cycled through by the timed loop (made before timing).
NUM_BATCHES = 4
FLOOR_LOCAL = "floor:local"
FLOOR_ALLREDUCE = "floor:allreduce"
FLOOR_FUSED = "floor:fused"
FLOORS = (FLOOR_LOCAL, FLOOR_ALLREDUCE, FLOOR_FUSED)


class TimedCollectives:
    """A :class:`ddp_impl.runtime.collectives.Collectives` proxy that times ``all_reduce_``.

    On gloo the call blocks until the reduction is done, so ``seconds`` is the
    time the caller waited; on XLA collectives are lazy and ``seconds`` is only
    the tracing time (the counts and sizes are still exact).
    """

    def __init__(self, inner):
        self.inner = inner
        self.rank = inner.rank
        self.world_size = inner.world_size
        self.reset()

    def reset(self):
        self.calls = 0
        self.seconds = 0.0
        self.numels: list[int] = []
        self.durations: list[float] = []

    def all_reduce_(self, tensor, *, scale=1.0):
        t0 = time.perf_counter()
        out = self.inner.all_reduce_(tensor, scale=scale)
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.calls += 1
        self.numels.append(int(tensor.numel()))
        self.durations.append(dt)
        return out

    def per_call(self, steps: int) -> list[float]:
        """Mean seconds of the k-th all-reduce of a step, for each k (same calls every step)."""
        k = self.calls // steps if steps else 0
        if not k or k * steps != self.calls:
            return []
        return [sum(self.durations[i::k]) / steps for i in range(k)]

    def broadcast_(self, tensor, src=0):
        return self.inner.broadcast_(tensor, src=src)

    def all_gather(self, tensor):
        return self.inner.all_gather(tensor)

    def barrier(self):
        return self.inner.barrier()


def _torch_ddp_info(ddp) -> dict:
    """Bucket layout and comm timing torch's DDP logs about itself (best effort)."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception as exc:  # private API; absent on some builds
        return {"logging_data": f"unavailable: {type(exc).__name__}"}
    keys = ("bucket_sizes", "rebuilt_bucket_sizes", "has_rebuilt_buckets", "bucket_cap_bytes",
            "avg_backward_compute_time", "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time", "backend_name")
    return {k: data[k] for k in keys if k in data}


def bench_task(ctx, variant: str, model: str, global_batch: int, warmup: int, steps: int,
               lr: float, seed: int, ddp_kwargs: tuple = (), profile: bool = False) -> dict:
    """World task: time ``steps`` steps of ``variant`` on this replica (see the module doc).

    Returns ``elapsed_s`` (the timed loop, wall), ``step_s`` (per step, list),
    ``phases_s`` (mean seconds per step of forward+loss, backward,
    after_backward+optimizer, mark_step), ``local_batch``, ``grad_numel`` and,
    when profiling, ``allreduce`` (calls, element counts, seconds per step).
    """
    import torch
    import torch.nn.functional as F

    from fixtures import build_model, global_batch as make_batch, shard

    W = ctx.world_size
    local_batch = global_batch // W
    net = build_model(model, seed=seed).to(ctx.device)
    grad_numel = sum(p.numel() for p in net.parameters() if p.requires_grad)
    batches = []
    for i in range(NUM_BATCHES):
        x, y = make_batch(model, seed, i, global_batch)
        batches.append((shard(x, ctx.rank, W).to(ctx.device), shard(y, ctx.rank, W).to(ctx.device)))

    timed = TimedCollectives(ctx.collectives) if profile else None
    rctx = dataclasses.replace(ctx, collectives=timed) if profile else ctx
    info: dict = {}
    phases = [0.0, 0.0, 0.0, 0.0]

    if variant == FLOOR_ALLREDUCE:
        flat = torch.zeros(grad_numel, device=ctx.device)
        coll = rctx.collectives

        def step(i):
            t0 = time.perf_counter()
            coll.all_reduce_(flat, scale=1.0 / W)
            t1 = time.perf_counter()
            ctx.mark_step()
            t2 = time.perf_counter()
            phases[1] += t1 - t0
            phases[3] += t2 - t1
    else:
        fused = None
        if variant in (FLOOR_LOCAL, FLOOR_FUSED):
            wrapped, after_backward = net, None
            if variant == FLOOR_FUSED:
                fused = torch.zeros(grad_numel, device=ctx.device)
        else:
            from conformance.impls.builtin import resolve_impl
            impl = resolve_impl(variant)
            why = impl.unsupported.get(ctx.runtime)
            if why:
                return {"unsupported": why}
            wrapped = impl.wrap(net, rctx, dict(ddp_kwargs))
            after_backward = impl.after_backward
            ctx.mark_step()  # run the construction's broadcasts on their own (as the train loop does)
        opt = torch.optim.SGD(wrapped.parameters(), lr=lr)

        def step(i):
            x, y = batches[i % NUM_BATCHES]
            opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss = F.mse_loss(wrapped(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            if fused is not None:
                rctx.collectives.all_reduce_(fused, scale=1.0 / W)
            if after_backward is not None:
                after_backward(wrapped, opt, rctx)
            opt.step()
            t3 = time.perf_counter()
            ctx.mark_step()
            t4 = time.perf_counter()
            phases[0] += t1 - t0
            phases[1] += t2 - t1
            phases[2] += t3 - t2
            phases[3] += t4 - t3

    for i in range(warmup):
        step(i)
    ctx.mark_step()
    ctx.collectives.barrier()  # every replica starts the timed loop together
    phases[:] = [0.0] * 4
    if timed is not None:
        timed.reset()
    step_s = []
    start = time.perf_counter()
    for i in range(steps):
        t = time.perf_counter()
        step(warmup + i)
        step_s.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - start
    if variant not in FLOORS and ctx.runtime == "cpu" \
            and type(wrapped).__module__.startswith("torch.nn.parallel"):
        info["torch_ddp"] = _torch_ddp_info(wrapped)
    out = {"elapsed_s": elapsed, "step_s": step_s, "phases_s": [p / steps for p in phases],
           "local_batch": local_batch, "grad_numel": grad_numel, **info}
    if timed is not None:
        out["allreduce"] = {"calls_per_step": timed.calls / steps,
                            "numels": timed.numels[:timed.calls // steps] if steps else [],
                            "seconds_per_step": timed.seconds / steps,
                            "seconds_per_call": timed.per_call(steps)}
    return out


def host_info(ctx) -> dict:
    """World task: the implementation table and versions as this replica's host sees them."""
    import torch

    from conformance.impls.builtin import IMPLS
    info = {"impls": sorted(IMPLS), "torch": torch.__version__, "device": str(ctx.device),
            "num_threads": torch.get_num_threads()}
    try:
        import torch_xla
        info["torch_xla"] = torch_xla.__version__
    except ImportError:
        pass
    return info
