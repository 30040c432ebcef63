"""The PJRT runtime adapter and ddp_impl.runtime.xla on the PJRT CPU device.

One host process x W replica threads (the TPU v2/v3 shape). Tests marked
``pjrt`` skip with the adapter's one-line reason when torch_xla 2.9 is not
installed; the unit tests at the top need no torch_xla.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conformance.cases.invariant.kind import check_reports, rank_invariant_violations, rank_report
from conformance.settings import Settings, emulated_hosts
from conformance.worlds.runtimes.pjrt_hosts import HostLayout
from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime
from conformance.worlds.failure import ReplicaDied, ReplicaFailed
from conformance.worlds.registry import WorldKey
from conformance.worlds.spawned import World

SIZES = [2, 4, pytest.param(8, marks=pytest.mark.slow)]
STEPS, GLOBAL_BATCH, LR = 20, 24, 0.1
# Float32 parity of 20 SGD steps; the notes measured 2.98e-08.
PARITY_ATOL = 1e-6


# --- tasks (module level: the World pickles them by reference) -------------

def collectives_task(ctx):
    import torch
    r, w, c = ctx.rank, ctx.world_size, ctx.collectives
    red = (torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r).to(ctx.device)
    c.all_reduce_(red, scale=1.0 / w)
    gathered = c.all_gather(torch.tensor([r, -r, 7 * r], dtype=torch.float32).to(ctx.device))
    special = torch.tensor([float("nan"), -0.0, float("inf")]) if r == w - 1 else torch.zeros(3)
    bcast = special.to(ctx.device)
    c.broadcast_(bcast, src=w - 1)
    ints = torch.tensor([r, -r], dtype=torch.int64).to(ctx.device)
    c.broadcast_(ints, src=1)
    ctx.mark_step()
    c.barrier()
    return {"bindings": ctx.bindings, "reduced": red.cpu().numpy(),
            "gathered": [g.cpu().numpy() for g in gathered], "bcast": bcast.cpu().numpy(),
            "ints": ints.cpu().numpy(), "module_api": _module_bindings()}


def _module_bindings():
    from ddp_impl.runtime import ranks
    return (ranks.process_index(), ranks.process_count(), ranks.global_ordinal(),
            ranks.local_ordinal(), ranks.world_size(), ranks.local_device_count())


def train_task(ctx, steps, global_batch, lr, seed=0):
    import time

    import torch
    import torch.nn.functional as F

    from ddp_impl import DistributedDataParallel
    from fixtures import build_model, global_batch as make_batch, shard
    model = build_model("linear", seed).to(ctx.device)
    ddp = DistributedDataParallel(model, collectives=ctx.collectives)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    batches = [make_batch("linear", seed, s, global_batch) for s in range(steps)]
    stamps = []
    for x, y in batches:
        xs = shard(x, ctx.rank, ctx.world_size).to(ctx.device)
        ys = shard(y, ctx.rank, ctx.world_size).to(ctx.device)
        opt.zero_grad()
        F.mse_loss(ddp(xs), ys).backward()
        opt.step()
        ctx.mark_step()
        stamps.append(time.perf_counter())
    return {"params": {n: p.detach().cpu().numpy() for n, p in model.named_parameters()},
            "stamps": stamps}


def raise_on_one(ctx):
    import torch
    if ctx.rank == 1:
        raise ValueError("boom from replica 1")
    t = torch.ones(2).to(ctx.device)
    ctx.collectives.all_reduce_(t)
    ctx.mark_step()
    return t.cpu().tolist()


def asymmetric_graph(ctx):
    import torch
    t = torch.ones(2).to(ctx.device)
    if ctx.rank == 0:
        t = t * 3.0 + 1.0  # another graph on replica 0: its collective never meets the others'
    ctx.collectives.all_reduce_(t)
    ctx.mark_step()
    return t.cpu().tolist()


def process_group_task(ctx):
    import torch
    import torch.distributed as dist

    from conformance.cases.invariant.kind import rank_report
    from ddp_impl.runtime.xla import init_pjrt_process_group
    first = init_pjrt_process_group()
    again = init_pjrt_process_group()  # idempotent per process
    t = torch.ones(2).to(ctx.device)
    dist.all_reduce(t)  # the xla backend reduces over every replica thread
    ctx.mark_step()
    return {"first": first, "again": again, "rank": dist.get_rank(), "world": dist.get_world_size(),
            "backend": dist.get_backend(), "value": t.cpu().tolist(), "report": rank_report(ctx)}


_FOREIGN_PG_LOCK = __import__("threading").Lock()


def foreign_process_group_task(ctx):
    """torch.distributed initialised by someone else (gloo): init_pjrt_process_group refuses."""
    import torch.distributed as dist

    from ddp_impl.runtime.xla import init_pjrt_process_group
    with _FOREIGN_PG_LOCK:
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        init_pjrt_process_group()
    except RuntimeError as exc:
        return str(exc)
    return None


def batchnorm_running_var_task(ctx):
    """One training-mode BatchNorm1d forward on this replica's XLA device."""
    import torch
    x = torch.linspace(-2.0, 3.0, 24).reshape(6, 4) ** 2
    bn = torch.nn.BatchNorm1d(4).to(ctx.device)
    bn(x.to(ctx.device))
    ctx.mark_step()
    return {"x": x.numpy(), "running_var": bn.running_var.cpu().numpy(),
            "running_mean": bn.running_mean.cpu().numpy()}


def graph_flags_task(ctx):
    import torch_xla
    C = torch_xla._XLAC
    return C._get_xla_handle_special_scalars(), C._get_xla_enable_device_data_cache()


def equal_scalar_buffers_task(ctx, seed):
    """Rank 0's two BatchNorm layers get equal num_batches_tracked, rank 1's differ
    (properties.broadcast_task): with torch_xla's device-data cache on, equal 0-dim
    values shared one graph parameter and XLA aborted the host."""
    from conformance.cases.property.tasks import broadcast_task
    return broadcast_task(ctx, impl="ref", widths=(3, 3, 12, 3), seed=seed)


def host_buffers_step_task(ctx):
    """One synced step of a BatchNorm model whose buffers came straight from the host
    (broadcast_buffers=False): with buffer donation this aborted the host in 5 of 9 runs."""
    import torch
    import torch.nn.functional as F

    import ddp_impl
    from fixtures import build_model, global_batch, shard
    m = build_model("batchnorm", seed=1 + 7919 * ctx.rank, perturb_buffers=0.5 * ctx.rank).to(ctx.device)
    ddp = ddp_impl.DistributedDataParallel(m, collectives=ctx.collectives, broadcast_buffers=False)
    ctx.mark_step()
    [b.cpu() for b in m.buffers()]
    x, y = global_batch("batchnorm", 1, 0, 24)
    xs, ys = (shard(t, ctx.rank, ctx.world_size).to(ctx.device) for t in (x, y))
    F.mse_loss(ddp(xs), ys).backward()
    ctx.mark_step()
    return [p.grad.cpu().numpy() for p in m.parameters()]


def torch_ddp_pjrt_group_task(ctx):
    """Upstream DDP over the xla group initialised once per process (rank = process index)."""
    import torch

    from ddp_impl.runtime.xla import init_pjrt_process_group
    init_pjrt_process_group()
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 10).to(ctx.device))
    ctx.mark_step()
    return "constructed"


def torch_ddp_xla_url_task(ctx):
    """Upstream DDP over the xla group initialised by every replica thread with xla://."""
    import torch
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401  registers xla://
    dist.init_process_group("xla", init_method="xla://")
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 10).to(ctx.device))
    ctx.mark_step()
    return "constructed"


def xla_fsdp_step_task(ctx):
    """One training step of XlaFullyShardedDataParallel over a Linear, replica shards of 4 rows."""
    import torch

    from conformance.impls.xla_paths import _wrap_xla_fsdp
    torch.manual_seed(0)
    model = _wrap_xla_fsdp(torch.nn.Linear(10, 10).to(ctx.device), ctx, {})
    ctx.mark_step()  # construction: passes
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 10).to(ctx.device), torch.randn(4, 10).to(ctx.device)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    ctx.mark_step()
    return "trained"


def cpu_reference(steps, global_batch, lr, seed=0):
    import torch
    import torch.nn.functional as F

    from fixtures import build_model, global_batch as make_batch
    model = build_model("linear", seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for s in range(steps):
        x, y = make_batch("linear", seed, s, global_batch)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


# --- unit tests: no torch_xla needed ----------------------------------------

def test_check_names_missing_torch_xla(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch_xla" else real(name, *a))
    with pytest.raises(RuntimeUnavailable, match="torch_xla is not installed") as info:
        get_runtime("pjrt").check(2)
    assert "ddp-conformance[pjrt]" not in str(info.value)  # not on PyPI: issue 29 item 7e


def test_install_hint_works_from_a_clone_and_names_pyprojects_pair():
    """The hint installs the clone's pjrt extra, and the pair it names is the one pyproject pins
    (torch_xla needs its own torch release: installing it next to torch 2.13 replaces torch)."""
    import pathlib
    import re
    from ddp_impl.runtime.xla import PJRT_INSTALL_HINT
    pyproject = (pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    extra = re.search(r"^pjrt = \[(.*)\]$", pyproject, re.M)[1]
    pins = sorted(re.findall(r'"([\w]+==[\d.]+)"', extra))
    assert pins == ["torch==2.9.0", "torch_xla==2.9.0"], extra
    assert "pip install -e '.[pjrt]'" in PJRT_INSTALL_HINT
    for pin in pins:
        assert pin in PJRT_INSTALL_HINT, (pin, PJRT_INSTALL_HINT)


def test_check_names_unsupported_version(monkeypatch):
    import importlib.metadata
    import importlib.util
    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_xla" else real_spec(name, *a))
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "2.5.1" if name == "torch_xla" else real_version(name))
    monkeypatch.delenv("DDP_IMPL_ALLOW_UNTESTED_TORCH_XLA", raising=False)
    with pytest.raises(RuntimeUnavailable, match=r"torch_xla 2\.5\.1 is not supported \(need 2\.9\.x"):
        get_runtime("pjrt").check(2)


def test_check_rejects_world_size_out_of_range():
    with pytest.raises(RuntimeUnavailable, match="world size 17 is above 16, the largest runtime pjrt runs"):
        get_runtime("pjrt").check(17)


def test_host_envs_one_host_with_w_cpu_devices():
    envs = get_runtime("pjrt").host_envs(8)
    assert len(envs) == 1
    env = envs[0]
    assert env["PJRT_DEVICE"] == "CPU" and env["CPU_NUM_DEVICES"] == "8"
    assert int(env["XLA_THREAD_POOL_SIZE"]) >= 8  # notes: pool < W deadlocks
    assert env["XLA_ENABLE_PARAM_ALIASING"] == "0"  # ddp_impl.runtime.xla, measure 4


# --- on the runtime ---------------------------------------------------------

def _available(w):
    try:
        get_runtime("pjrt").check(w)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")


@pytest.fixture
def pjrt_world(request, world_pool):
    _available(request.param)
    return world_pool.get(WorldKey("pjrt", request.param))


@pytest.mark.pjrt
@pytest.mark.parametrize("pjrt_world", SIZES, indirect=True, ids=lambda w: f"w{w}")
def test_bindings_and_collectives(pjrt_world):
    w = pjrt_world.world_size
    hosts = emulated_hosts(pjrt_world.settings, w, "pjrt")  # W=2: 2 emulated hosts x 1
    res = pjrt_world.run(collectives_task)
    for r, d in enumerate(res):
        b = d["bindings"]
        got = (b.process_index, b.process_count, b.global_ordinal, b.local_ordinal,
               b.world_size, b.local_device_count)
        lay = HostLayout.of(r, w, hosts)
        assert got == (lay.host, hosts, r, lay.local_ordinal, w, w // hosts)
        assert d["module_api"] == got
        want = (np.arange(6, dtype=np.float32).reshape(2, 3) * w + 10 * w * (w - 1) / 2) / w
        np.testing.assert_allclose(d["reduced"], want, rtol=1e-6)
        for i, g in enumerate(d["gathered"]):
            np.testing.assert_array_equal(g, [i, -i, 7 * i])
        # broadcast copies values: NaN and inf survive (XLA:CPU's all-gather
        # drops the sign of -0.0, so only the value 0 is checked)
        assert np.isnan(d["bcast"][0]) and d["bcast"][1] == 0 and d["bcast"][2] == np.inf
        np.testing.assert_array_equal(d["ints"], [1, -1])


@pytest.mark.pjrt
@pytest.mark.parametrize("pjrt_world", SIZES, indirect=True, ids=lambda w: f"w{w}")
def test_ddp_training_matches_cpu_reference(pjrt_world):
    ref = cpu_reference(STEPS, GLOBAL_BATCH, LR)
    res = pjrt_world.run(train_task, steps=STEPS, global_batch=GLOBAL_BATCH, lr=LR)
    diff = max(float(np.abs(d["params"][k] - ref[k]).max()) for d in res for k in ref)
    assert diff <= PARITY_ATOL, f"max |param - reference| = {diff:.3g}"
    for d in res[1:]:  # replicas end bit-identical
        for k in ref:
            np.testing.assert_array_equal(d["params"][k], res[0]["params"][k])


@pytest.mark.pjrt
def test_replica_exception_is_reported_with_its_traceback():
    _available(2)
    with World("pjrt", 2, timeout=60) as world:
        with pytest.raises(ReplicaFailed, match="boom from replica 1") as info:
            world.run(raise_on_one)
        assert "1 replica(s) raised; replica 1 raised ValueError" in info.value.summary()
        assert [d["status"] for d in info.value.diagnosis] == ["aborted-by-peer", "raised"]
        assert world.broken


@pytest.mark.pjrt
@pytest.mark.slow
def test_collective_mismatch_kills_only_the_host():
    """Different graphs per replica: XLA aborts the host (~10-20 s); the World names it."""
    _available(2)
    world = World("pjrt", 2, timeout=90)
    try:
        with pytest.raises(ReplicaDied, match="(?s)exited with code.*(Termination timeout|rendezvous)"):
            world.run(asymmetric_graph)
    finally:
        world.close()


@pytest.mark.pjrt
def test_process_group_has_process_rank_and_spans_replicas():
    """On one host (the group is the real process's, also on an emulated multi-host world)."""
    _available(2)
    with World("pjrt", 2, timeout=60, settings=Settings(pjrt_hosts=())) as world:
        res = world.run(process_group_task)
    assert sorted(d["first"] for d in res) == [False, True]  # one thread initialised it
    assert not any(d["again"] for d in res)
    for d in res:
        assert (d["rank"], d["world"], d["backend"]) == (0, 1, "xla")
        assert d["value"] == [2.0, 2.0]
    # JAX semantics: torch.distributed rank = process index (0), not the replica's ordinal
    reports = [d["report"] for d in res]
    assert [r["dist"] for r in reports] == [{"rank": 0, "world_size": 1}] * 2
    assert [r["bindings"]["global_ordinal"] for r in reports] == [0, 1]
    assert check_reports(reports, 2) == []


@pytest.mark.pjrt
def test_process_group_refuses_a_foreign_default_group():
    _available(2)
    with World("pjrt", 2, timeout=60) as world:
        res = world.run(foreign_process_group_task)
    assert res == ["torch.distributed is already initialised (not by ddp_impl.runtime.xla)"] * 2


@pytest.mark.pjrt
@pytest.mark.parametrize("pjrt_world", SIZES, indirect=True, ids=lambda w: f"w{w}")
def test_rank_invariants_pjrt(pjrt_world):
    """1 process x W replica threads, shown as H emulated hosts (Settings.pjrt_hosts): process
    index = host, ordinals 0..W-1 unique, local ordinals 0..W/H-1 per host."""
    w = pjrt_world.world_size
    hosts = emulated_hosts(pjrt_world.settings, w, "pjrt")
    reports = pjrt_world.run(rank_report)
    assert rank_invariant_violations([dict(r["bindings"], host=r["host"]) for r in reports], w) == []
    assert check_reports(reports, w) == []
    assert len({r["pid"] for r in reports}) == 1  # one real host process
    for ordinal, r in enumerate(reports):
        b, lay = r["bindings"], HostLayout.of(ordinal, w, hosts)
        assert r["module_api"] == b
        assert (b["process_index"], b["process_count"], b["local_device_count"]) == (lay.host, hosts, w // hosts)
        assert r["host"] == str(lay.host)
        assert b["global_ordinal"] == ordinal == r["ctx_rank"] and b["local_ordinal"] == lay.local_ordinal


@pytest.mark.pjrt
def test_xla_batchnorm_running_var_is_biased(world_pool):
    """Pins the runtime quirk the reference reproduces on PJRT (conformance.cases.shared.reference.QUIRKS):
    torch_xla 2.9 updates running_var with the biased batch variance, CPU torch the unbiased."""
    _available(2)
    assert "bn_running_var_biased" in get_runtime("pjrt").reference_quirks
    for d in world_pool.get(WorldKey("pjrt", 2)).run(batchnorm_running_var_task):
        x, m = d["x"].astype(np.float64), 0.1
        biased, unbiased = x.var(axis=0), x.var(axis=0, ddof=1)
        np.testing.assert_allclose(d["running_var"], (1 - m) + m * biased, rtol=1e-6)
        assert np.abs(d["running_var"] - ((1 - m) + m * unbiased)).max() > 1e-2
        np.testing.assert_allclose(d["running_mean"], m * x.mean(axis=0), rtol=1e-6)


def host_copies_task(ctx):
    """Pending (not yet stepped) and materialised XLA tensors of several dtypes and shapes,
    and a CPU one, read back by conformance.cases.shared.readback.on_host and by .cpu()."""
    import torch
    from conformance.cases.shared.readback import on_host
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + ctx.rank
    ts = [base.to(ctx.device), torch.tensor([1.5, -2.0], dtype=torch.float64).to(ctx.device),
          torch.tensor(7, dtype=torch.int64).to(ctx.device), base.t().contiguous(), torch.ones(2).to(ctx.device) * 3]
    ctx.mark_step()
    ts.append(ts[0] * 2)  # pending: computed by the read
    got, want = on_host(ts), [t.cpu() for t in ts]
    return [(g.device.type, str(g.dtype), g.numpy().tolist() == w.numpy().tolist()) for g, w in zip(got, want)]


@pytest.mark.pjrt
def test_host_copies_match_per_tensor_reads(world_pool):
    """The batched device-to-host copy the readback uses on XLA gives what .cpu() gives,
    in order, for every dtype, a pending tensor and a CPU tensor among them."""
    _available(2)
    for rows in world_pool.get(WorldKey("pjrt", 2)).run(host_copies_task):
        assert [r[0] for r in rows] == ["cpu"] * 6
        assert [r[1] for r in rows] == ["torch.float32", "torch.float64", "torch.int64", "torch.float32",
                                        "torch.float32", "torch.float32"]
        assert all(r[2] for r in rows), rows


@pytest.mark.pjrt
def test_graphs_do_not_depend_on_scalar_values(world_pool):
    """ddp_impl.runtime.xla measure 5 (value_independent_graphs, set by the adapter)."""
    _available(2)
    world = world_pool.get(WorldKey("pjrt", 2))
    assert world.run(graph_flags_task) == [(False, False)] * 2
    from conformance.cases.property.models import build_bn_net
    counts = [[int(b) for n, b in build_bn_net((3, 3, 12, 3), 10 + 7919 * r).named_buffers()
               if n.endswith("num_batches_tracked")] for r in range(2)]
    assert counts[0][0] == counts[0][1] and counts[1][0] != counts[1][1]  # the trap is armed
    res = world.run(equal_scalar_buffers_task, seed=10, timeout=60)
    for d in res:
        assert all((a == b).all() for (_, a), (_, b) in zip(d["first"], res[0]["first"]))


@pytest.mark.pjrt
def test_host_buffers_step_does_not_abort(world_pool):
    """Regression for buffer donation in the step marker (ddp_impl.runtime.xla, measure 4)."""
    _available(2)
    world = world_pool.get(WorldKey("pjrt", 2))
    for _ in range(5):
        res = world.run(host_buffers_step_task, timeout=60)
        for a, b in zip(*res):  # gradients synced: bit-identical on both replicas
            np.testing.assert_array_equal(a, b)


@pytest.mark.pjrt
def test_torch_ddp_on_pjrt_fails_in_constructor():
    """Upstream DDP over init_pjrt_process_group's group (one per process) in 1 x W threads:
    the measurement behind IMPLS["torch"].unsupported["pjrt"]."""
    from conformance.impls.builtin import IMPLS, TORCH_DDP_ON_PJRT
    _available(2)
    with World("pjrt", 2, timeout=60) as world:
        with pytest.raises(ReplicaFailed) as info:
            world.run(torch_ddp_pjrt_group_task)
    text = str(info.value)
    assert "2 replica(s) raised" in text
    assert "_verify_param_shape_across_processes" in text and "xla_backend.py" in text
    assert "IndexError: list index out of range" in text
    assert IMPLS["torch"].unsupported["pjrt"] == TORCH_DDP_ON_PJRT
    assert TORCH_DDP_ON_PJRT.startswith("unsupported topology: DDP() raises IndexError: list index out of range")


def _assert_xla_aborts(task, collective):
    """``task`` on a W=2 world makes XLA abort the host: its ``collective``'s rendezvous
    never completes (SIGABRT after XLA's termination timeout, ~15 s)."""
    _available(2)
    world = World("pjrt", 2, timeout=90)
    try:
        with pytest.raises(ReplicaDied, match=rf"(?s)exited with code -6.*Termination timeout for `{collective}"):
            world.run(task)
    finally:
        world.close()


@pytest.mark.pjrt
def test_torch_ddp_on_pjrt_with_per_thread_xla_url_aborts_the_host():
    """The other way to give every thread a group (xla://): XLA aborts the host (~15 s)."""
    from conformance.impls.builtin import TORCH_DDP_ON_PJRT
    _assert_xla_aborts(torch_ddp_xla_url_task, "all gather")
    assert "XLA aborts the host (Termination timeout for all gather" in TORCH_DDP_ON_PJRT


@pytest.mark.pjrt
def test_xla_fsdp_in_threads_aborts():
    """XlaFullyShardedDataParallel in 1 x W threads: constructs, then the first step's
    all-reduces never meet and XLA aborts the host (~15 s): IMPLS["xla_fsdp"]'s reason."""
    from conformance.impls.builtin import IMPLS
    from conformance.impls.xla_paths import XLA_FSDP_ON_PJRT
    _assert_xla_aborts(xla_fsdp_step_task, "all reduce")
    assert IMPLS["xla_fsdp"].unsupported["pjrt"] == XLA_FSDP_ON_PJRT


SPAWN_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["PJRT_DEVICE"] = "CPU"
    from ddp_impl.runtime.xla import spawn

    def fn(index, tag):
        import torch, torch_xla
        import torch.distributed as dist
        from ddp_impl import ranks, xla
        dev = torch_xla.device()
        t = torch.tensor([float(index)]).to(dev)
        xla.XlaCollectives(dev).all_reduce_(t)
        xla.mark_step(dev)
        b = ranks.bindings()
        pg = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else ("none", "none")
        row = [tag, index, b.global_ordinal, b.world_size, b.process_index, *pg, t.cpu().item(),
               os.environ.get("XLA_ENABLE_PARAM_ALIASING")]
        os.write(1, (" ".join(map(str, row)) + "\\n").encode())  # one write: replica threads interleave print()

    if __name__ == "__main__":
        spawn(fn, args=("row",), nprocs=3, init_torch_distributed=sys.argv[1] == "1")
        import torch.distributed as dist
        print("done", dist.is_initialized(), flush=True)
""")


@pytest.mark.pjrt
@pytest.mark.parametrize("init", [True, False], ids=["init_torch_distributed", "no_process_group"])
def test_spawn_runs_every_replica(tmp_path, init):
    """ddp_impl.runtime.xla.spawn both ways: with init_torch_distributed one xla group per process
    (rank = process index 0, world 1) that is gone afterwards; without, no group at all."""
    _available(3)
    script = tmp_path / "spawn_main.py"
    script.write_text(SPAWN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("XLA_ENABLE_PARAM_ALIASING", None)
    proc = subprocess.Popen([sys.executable, str(script), "1" if init else "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"spawn did not finish within 180 s:\n{out[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any leftover pool worker
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-3000:]
    rows = sorted(tuple(line.split()[1:]) for line in out.splitlines() if line.startswith("row "))
    pg = ("0", "1") if init else ("none", "none")
    # ordinal, global ordinal, world size, process index, pg rank/size, all-reduce, aliasing
    assert rows == [(str(i), str(i), "3", "0", *pg, "3.0", "0") for i in range(3)], out[-3000:]
    assert "done False" in out


@pytest.mark.pjrt
def test_cli_puts_cpu_and_pjrt_in_one_table(tmp_path):
    """``python -m conformance run --runtime cpu,pjrt``: one table, one JSON, both runtimes."""
    import json
    _available(2)
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, "-m", "conformance", "run", "--runtime", "cpu,pjrt",
                             "--world-size", "2", "--only", "parity.linear", "--quiet", "--json", str(report)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"conformance run did not finish within 300 s:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    rows = {(v["runtime"], v["impl"], v["status"]) for v in json.loads(report.read_text())["verdicts"]}
    assert rows == {("cpu", "torch", "pass"), ("cpu", "ref", "pass"), ("pjrt", "ref", "pass"),
                    ("pjrt", "xla_recipe", "pass"), ("pjrt", "torch", "unsupported")}, rows
    table = [ln.split() for ln in out.splitlines() if ln.startswith("parity.linear") and " param_parity " in ln]
    assert {(t[3], t[4]) for t in table} == {("torch", "cpu"), ("ref", "cpu"), ("ref", "pjrt"),
                                             ("xla_recipe", "pjrt"), ("torch", "pjrt")}
