"""The PJRT runtime adapter and ddp_impl.xla on the PJRT CPU device.

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

from conformance.runtimes import RuntimeUnavailable, get_runtime
from conformance.world import ReplicaDied, ReplicaFailed, World

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
    from ddp_impl import ranks
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

    from ddp_impl.xla import init_pjrt_process_group
    first = init_pjrt_process_group()
    t = torch.ones(2).to(ctx.device)
    dist.all_reduce(t)  # the xla backend reduces over every replica thread
    ctx.mark_step()
    return {"first": first, "rank": dist.get_rank(), "world": dist.get_world_size(),
            "backend": dist.get_backend(), "value": t.cpu().tolist()}


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
    with pytest.raises(RuntimeUnavailable, match="torch_xla is not installed"):
        get_runtime("pjrt").check(2)


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
    with pytest.raises(RuntimeUnavailable, match="outside"):
        get_runtime("pjrt").check(17)


def test_host_envs_one_host_with_w_cpu_devices():
    envs = get_runtime("pjrt").host_envs(8)
    assert len(envs) == 1
    env = envs[0]
    assert env["PJRT_DEVICE"] == "CPU" and env["CPU_NUM_DEVICES"] == "8"
    assert int(env["XLA_THREAD_POOL_SIZE"]) >= 8  # notes: pool < W deadlocks


# --- on the runtime ---------------------------------------------------------

def _available(w):
    try:
        get_runtime("pjrt").check(w)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")


@pytest.fixture
def pjrt_world(request, world_pool):
    _available(request.param)
    return world_pool.get("pjrt", request.param)


@pytest.mark.pjrt
@pytest.mark.parametrize("pjrt_world", SIZES, indirect=True, ids=lambda w: f"w{w}")
def test_bindings_and_collectives(pjrt_world):
    w = pjrt_world.world_size
    res = pjrt_world.run(collectives_task)
    for r, d in enumerate(res):
        b = d["bindings"]
        got = (b.process_index, b.process_count, b.global_ordinal, b.local_ordinal,
               b.world_size, b.local_device_count)
        assert got == (0, 1, r, r, w, w)
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
        assert "after replica(s) [1] raised" in str(info.value)
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
    _available(2)
    with World("pjrt", 2, timeout=60) as world:
        res = world.run(process_group_task)
    assert sorted(d["first"] for d in res) == [False, True]  # one thread initialised it
    for d in res:
        assert (d["rank"], d["world"], d["backend"]) == (0, 1, "xla")
        assert d["value"] == [2.0, 2.0]


SPAWN_SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["PJRT_DEVICE"] = "CPU"
    from ddp_impl.xla import spawn

    def fn(index, tag):
        import torch, torch_xla
        import torch.distributed as dist
        from ddp_impl import ranks, xla
        dev = torch_xla.device()
        t = torch.tensor([float(index)]).to(dev)
        xla.XlaCollectives(dev).all_reduce_(t)
        xla.mark_step(dev)
        b = ranks.bindings()
        print(tag, index, b.global_ordinal, b.world_size, dist.get_rank(), dist.get_world_size(),
              t.cpu().item(), flush=True)

    if __name__ == "__main__":
        spawn(fn, args=("row",), nprocs=3, init_torch_distributed=True)
        print("done", flush=True)
""")


@pytest.mark.pjrt
def test_spawn_runs_every_replica_with_one_process_group(tmp_path):
    _available(3)
    script = tmp_path / "spawn_main.py"
    script.write_text(SPAWN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
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
    assert rows == [(str(i), str(i), "3", "0", "1", "3.0") for i in range(3)], out[-3000:]
    assert "done" in out
