"""Graph agreement on XLA: every replica builds the same step graph.

XLA's in-process CPU collectives meet only when every replica runs one executable (the kit
compiles it once under a lock: docs/runtimes/pjrt.md, cause 1); on a pod, replicas whose graphs
differ recompile per replica or wait forever in a collective. Arithmetic can be right while the
graphs differ: a rank-dependent Python constant (``t.mul_(1.0 if rank == 0 else 0.0)``) is
inlined by torch_xla's default graph rules ("special scalars", 0 and 1 become constants). The
kit's worlds switch those rules off (``ddp_impl.runtime.xla.value_independent_graphs``), so a
parity case cannot see it: :func:`task_graph_agreement` switches them **on** and the replicas,
threads of one process, compare the hashes of their pending graphs at a barrier before every step
sync (:class:`GraphRecorder`; ``_XLAC._get_graph_hash``, tens of microseconds, device-independent);
when they differ each renders its graph as HLO text once (``_get_xla_tensors_hlo``, ~1 ms) and the
pending graph is dropped (``_clear_pending_irs``: running it would make XLA abort in the
collective). The device-data cache stays off (its value dependence aborts the host, and is not a
DDP's doing). Private torch_xla APIs of the pinned 2.9.
"""
from __future__ import annotations

from itertools import zip_longest
import threading
import time

from conformance.cases.task.kind import replica_batch, replica_model
from conformance.cases.shared.step import construct
from conformance.impls.builtin import resolve_impl
from conformance.verdict import Verdict

GRAPH_AGREEMENT = "graph_agreement"
GRAPH_MODEL = "batchnorm"  # buffers: a DDP's per-forward buffer broadcast is in every step graph
GRAPH_STEPS = 3
BARRIER_S = 60.0  # replicas meet at each step sync; a first compile is well under it

_LOCK = threading.Lock()
_MEETINGS: dict = {}   # (world_size, run, call) -> {rank: value}
_BARRIERS: dict = {}   # (world_size, use) -> threading.Barrier


def _barrier(world_size: int, use: str = "meet") -> threading.Barrier:
    with _LOCK:
        return _BARRIERS.setdefault((world_size, use), threading.Barrier(world_size))


def _meet(ctx, key, value) -> dict:
    """Publish ``value`` for this replica under ``key``; return every replica's, once all
    have published (a thread barrier: the PJRT replicas share this process)."""
    with _LOCK:
        _MEETINGS.setdefault((ctx.world_size,) + key, {})[ctx.rank] = value
    _barrier(ctx.world_size).wait(BARRIER_S)
    with _LOCK:
        got = dict(_MEETINGS[(ctx.world_size,) + key])
    _barrier(ctx.world_size).wait(BARRIER_S)  # all have read before anyone forgets it
    with _LOCK:
        _MEETINGS.pop((ctx.world_size,) + key, None)
    return got


def hlo_ops(text: str) -> list[str]:
    """The instruction lines of an HLO module's text (``_get_xla_tensors_hlo``), without
    ``metadata=``: ``%constant.5 = f32[] constant(0)``. HLO, not the lazy IR text: the IR text
    prints a constant as ``prim::Constant()`` without its value."""
    return [line.split(", metadata={")[0] for line in map(str.strip, text.splitlines())
            if line.startswith(("%", "ROOT %"))]


def user_of(ops: list[str], i: int) -> str:
    """The first instruction after ``ops[i]`` that reads its result (``""``: none)."""
    name = ops[i].removeprefix("ROOT ").split(" = ")[0]
    return next((o for o in ops[i + 1:] if f"{name})" in o or f"{name}," in o), "")


def first_difference(a: list[str], b: list[str]) -> tuple[int, str, str]:
    """``(i, a[i], b[i])`` at the first op where two op lists differ (``"(none)"`` past an end)."""
    return next(((i, x, y) for i, (x, y) in enumerate(zip_longest(a, b, fillvalue="(none)")) if x != y),
                (-1, "", ""))


class GraphRecorder:
    """One replica's fingerprinting step sync: :meth:`step` hashes the pending graph of
    ``tensors`` (XLA tensors of this replica), compares with every replica, and runs the step
    sync only when all agree."""

    def __init__(self, ctx, run: int):
        import torch_xla
        self.C = torch_xla._XLAC
        self.ctx, self.run, self.call = ctx, run, 0
        self.hashes: list[str] = []
        self.cost_s = 0.0  # hashing and comparing, the step sync itself left out
        self._text: dict = {}

    def step(self, step: int, tensors: list):
        """``None`` (graphs agree; the step ran) or the difference, the same dict on every replica
        (replica 0's op against the first differing replica's)."""
        t0 = time.perf_counter()
        h = self.C._get_graph_hash(tensors).hex()
        self.call += 1
        hashes = _meet(self.ctx, (self.run, self.call, "hash"), h)
        self.cost_s += time.perf_counter() - t0
        if len(set(hashes.values())) == 1:
            self.hashes.append(h)
            self.ctx.mark_step()
            return None
        if h not in self._text:
            self._text[h] = hlo_ops(self.C._get_xla_tensors_hlo(tensors))
        ops = _meet(self.ctx, (self.run, self.call, "ops"), self._text[h])
        self.C._clear_pending_irs(str(self.ctx.device))  # never run: XLA would abort in the collective
        r = min(q for q in hashes if hashes[q] != hashes[0])
        i, theirs, mine = first_difference(ops[0], ops[r])
        return {"step": step, "replica": r, "index": i, "replica0_op": theirs, "replica_op": mine,
                "used_by": user_of(ops[r], i) if 0 <= i < len(ops[r]) else "",
                "ops": len(ops[r]), "hashes": [hashes[q] for q in sorted(hashes)]}


def task_graph_agreement(ctx, impl, model: str = GRAPH_MODEL, steps: int = GRAPH_STEPS, lr: float = 0.1):
    """Replica task: ``steps`` SGD steps of ``model`` wrapped in ``impl``, each replica's graph
    fingerprinted at construction (step 0) and at every step (module docstring). Returns
    ``{"hashes": [str, ...], "difference": dict | None, "cost_s"}``, or ``{"skip": reason}`` off
    the PJRT thread topology."""
    if ctx.runtime != "pjrt" or "thread_ident" not in ctx.extra:
        return {"skip": f"runtime {ctx.runtime} builds no per-replica XLA graphs (the PJRT runtime's "
                        "replica threads do)"}
    import torch
    import torch.nn.functional as F
    import torch_xla
    C = torch_xla._XLAC
    ctx.extra["graph_runs"] = run = ctx.extra.get("graph_runs", 0) + 1
    _barrier(ctx.world_size, "rules").wait(BARRIER_S)  # nobody builds a graph before the rules switch
    C._set_xla_handle_special_scalars(True)
    try:
        rec = GraphRecorder(ctx, run)
        m = replica_model(ctx, model)
        engine = construct(resolve_impl(impl), m, ctx, {}, lambda params: torch.optim.SGD(params, lr=lr))
        diff = rec.step(0, list(m.parameters()) + list(m.buffers()))
        for step in range(1, steps + 1):
            if diff is not None:
                break
            x, y, _, _ = replica_batch(model, step, ctx.world_size, ctx.rank)
            engine.zero_grad()
            engine.before_forward()
            loss = F.mse_loss(engine.model(x.to(ctx.device)), y.to(ctx.device))
            engine.backward(loss)
            engine.sync()
            engine.step()
            grads = [g for g in engine.grads(m) if g is not None]
            diff = rec.step(step, list(m.parameters()) + grads + list(m.buffers()) + [loss])
        return {"hashes": rec.hashes, "difference": diff, "cost_s": rec.cost_s}
    finally:
        _barrier(ctx.world_size, "rules").wait(BARRIER_S)  # every graph is built before the rules switch back
        C._set_xla_handle_special_scalars(False)


def judge_graph_agreement(results, impl, runtime):
    """``graph_agreement``: every replica's step graph has replica 0's hash at construction and
    at every step. A failure names the step, the replica and the first differing IR op."""
    w = len(results)
    base = dict(case="", check=GRAPH_AGREEMENT, impl=impl, runtime=runtime, model=GRAPH_MODEL, world_size=w)
    skip = next((r["skip"] for r in results if "skip" in r), None)
    if skip:
        return [Verdict(**base, status="skip", reason=skip)]
    d = results[0]["difference"]
    if d is not None:
        at = "at DDP construction" if d["step"] == 0 else f"at step {d['step']}"
        v = Verdict(**base, status="fail", replica=d["replica"], first_bad_step=d["step"] or None,
                    reason=f"replicas compiled different graphs {at}: replica {d['replica']}'s graph differs "
                           f"from replica 0's at op {d['index']} of {d['ops']}: "
                           f"{d['replica_op']!r} (replica {d['replica']}) vs {d['replica0_op']!r} (replica 0)"
                           + (f", read by {d['used_by']!r}" if d.get("used_by") else ""))
        return [v]
    n = len(results[0]["hashes"])
    if w < 2:
        return [Verdict(**base, status="vacuous", reason=f"world size {w} < 2: nothing to agree on")]
    cost = max(r.get("cost_s", 0.0) for r in results) / max(n, 1)
    return [Verdict(**base, status="pass", reason=f"{n} step graphs (construction + {n - 1} steps), "
                    f"one hash on all {w} replicas at each (hashing and comparing: {1e3 * cost:.2f} ms a step)")]
