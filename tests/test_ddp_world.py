"""Regression tests of the reference DDP on a real two-replica CPU world (gloo).

Each pins a fault an earlier reference had: an accumulated gradient of a
parameter unused in the synced micro-step left unreduced, gradients paired by
hook arrival order, a missing gradient, and buffers rebound in forward.
"""
import numpy as np
import pytest

from conformance.tolerances import lookup
from conformance.worlds.registry import WorldKey

pytestmark = pytest.mark.cpu

TINY_BUCKETS_MB = 1e-6  # every parameter closes its own bucket


@pytest.fixture
def world2(world_pool):
    return world_pool.get(WorldKey("cpu", 2))


def _batch(rank, step, n=6, features=10):
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(n, features, generator=g), torch.randn(n, 4, generator=g)


def _grads(module):
    """Every gradient as float64 numbers, ``None`` read as NaN, keyed by name."""
    return {n: (p.grad.detach().double().numpy().copy() if p.grad is not None
                else np.full(tuple(p.shape), np.nan)) for n, p in module.named_parameters()}


def _assert_replicas_hold_the_mean(results, atol):
    local = [r["local"] for r in results]
    for r in results:
        for name, got in r["ddp"].items():
            want = np.mean([loc[name] for loc in local], axis=0)  # NaN: no replica used it
            np.testing.assert_allclose(got, want, rtol=0, atol=atol, equal_nan=True, err_msg=name)


# --- an accumulated gradient counts as used (find_unused_parameters) --------

def task_unused_in_last_micro_step(ctx):
    import copy

    import torch.nn.functional as F

    from ddp_impl import DistributedDataParallel
    from fixtures import build_model
    m = build_model("unused", seed=7)
    ddp = DistributedDataParallel(m, collectives=ctx.collectives, find_unused_parameters=True)
    local = copy.deepcopy(m)  # after the construction broadcast: rank 0's weights
    (xa, ya), (xb, yb) = _batch(ctx.rank, 0), _batch(ctx.rank, 1)
    with ddp.no_sync():  # `branch` is used only in this micro-step
        F.mse_loss(ddp(xa, use_branch=True), ya).backward()
    F.mse_loss(ddp(xb, use_branch=False), yb).backward()
    F.mse_loss(local(xa, use_branch=True), ya).backward()
    F.mse_loss(local(xb, use_branch=False), yb).backward()
    return {"ddp": _grads(m), "local": _grads(local)}


def test_gradient_accumulated_under_no_sync_is_averaged(world2):
    results = world2.run(task_unused_in_last_micro_step)
    spread = np.max(np.abs(results[0]["local"]["branch.weight"] - results[1]["local"]["branch.weight"]))
    assert spread > 100 * lookup("cpu", "unused").atol  # replicas really differ before the sync
    _assert_replicas_hold_the_mean(results, lookup("cpu", "unused").atol)
    assert np.isnan(results[0]["ddp"]["never.weight"]).all()  # globally unused: stays None


# --- buckets pair parameter i with parameter i, whatever the hook order -----

def task_rank_dependent_hook_order(ctx, bucket_cap_mb):
    import copy

    import torch
    import torch.nn.functional as F
    from torch import nn

    from ddp_impl import DistributedDataParallel

    class TwoBranches(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(10, 4), nn.Linear(10, 4)

        def forward(self, x, a_first):  # backward runs the later-built branch first
            if a_first:
                ya = self.a(x)
                yb = self.b(x)
            else:
                yb = self.b(x)
                ya = self.a(x)
            return ya + 3.0 * yb

    torch.manual_seed(ctx.rank)  # the construction broadcast makes them equal
    m = TwoBranches()
    ddp = DistributedDataParallel(m, collectives=ctx.collectives, bucket_cap_mb=bucket_cap_mb)
    local = copy.deepcopy(m)
    order = []
    for n, p in m.named_parameters():  # runs after DDP's own hook
        p.register_post_accumulate_grad_hook(lambda p, n=n: order.append(n))
    x, y = _batch(ctx.rank, 0)
    F.mse_loss(ddp(x, a_first=ctx.rank == 0), y).backward()
    F.mse_loss(local(x, a_first=True), y).backward()
    return {"ddp": _grads(m), "local": _grads(local), "order": order}


@pytest.mark.parametrize("bucket_cap_mb", [TINY_BUCKETS_MB, None], ids=["bucket-per-param", "one-bucket"])
def test_rank_dependent_hook_order_keeps_pairs(world2, bucket_cap_mb):
    results = world2.run(task_rank_dependent_hook_order, bucket_cap_mb=bucket_cap_mb)
    assert results[0]["order"] != results[1]["order"]  # the hooks really fired in another order
    _assert_replicas_hold_the_mean(results, lookup("cpu", "unused").atol)


# --- a missing gradient is an error, not a hang ------------------------------

def task_missing_gradient(ctx):
    import torch.nn.functional as F

    from ddp_impl import DistributedDataParallel
    from fixtures import build_model
    m = build_model("unused", seed=7)
    ddp = DistributedDataParallel(m, collectives=ctx.collectives, bucket_cap_mb=TINY_BUCKETS_MB)
    x, y = _batch(ctx.rank, 0)
    try:
        F.mse_loss(ddp(x), y).backward()  # `never` gets no gradient anywhere
        message = None
    except RuntimeError as exc:
        message = str(exc)
    m2 = build_model("unused", seed=7)
    m2.never.requires_grad_(False)
    ddp2 = DistributedDataParallel(m2, collectives=ctx.collectives)  # kept: a dropped wrapper syncs nothing
    F.mse_loss(ddp2(x), y).backward()
    return {"message": message, "synced": m2.head.weight.grad.sum().item()}  # the world still works


def test_missing_gradient_raises_naming_the_parameter(world2):
    results = world2.run(task_missing_gradient, timeout=60)
    for r in results:
        assert r["message"] and "never.weight" in r["message"] and "never.bias" in r["message"]
    assert results[0]["synced"] == results[1]["synced"]


# --- buffers are read at broadcast time --------------------------------------

def task_rebound_buffer(ctx):
    import torch
    from torch import nn

    from ddp_impl import DistributedDataParallel

    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(10, 4)
            self.register_buffer("step_count", torch.zeros(()))

        def forward(self, x):
            self.step_count = self.step_count + 1  # rebinds the buffer to a new tensor
            return self.lin(x)

    m = Counter()
    ddp = DistributedDataParallel(m, collectives=ctx.collectives)
    if ctx.rank == 1:
        m.step_count = torch.tensor(100.0)  # a new object, not the one seen at construction
    counts = []
    for step in range(3):
        ddp(_batch(ctx.rank, step)[0])
        counts.append(m.step_count.item())
        if ctx.rank == 1:
            m.step_count.add_(5.0)  # edits the object the last forward created
    return counts


def test_buffer_rebound_in_forward_is_broadcast(world2):
    assert world2.run(task_rebound_buffer) == [[1.0, 2.0, 3.0]] * 2  # rank 0's count everywhere


# --- a gradient hook firing twice in one backward (reentrant checkpoint) ----

def task_hook_fires_twice(ctx):
    import copy

    import torch
    import torch.nn.functional as F

    from ddp_impl import DistributedDataParallel
    from fixtures import build_model
    x, y = torch.randn(6, 10, generator=torch.Generator().manual_seed(ctx.rank)), torch.zeros(6, 10)
    m = build_model("checkpoint_reentrant", seed=7)
    ddp = DistributedDataParallel(m, collectives=ctx.collectives, bucket_cap_mb=TINY_BUCKETS_MB)
    local0 = copy.deepcopy(m)
    F.mse_loss(ddp(x), y).backward()  # nested firings seen: reduced at the outer backward's end
    F.mse_loss(local0(x), y).backward()
    first = {"ddp": _grads(m), "local": _grads(local0)}
    m2 = build_model("checkpoint_reentrant", seed=7)
    ddp2 = DistributedDataParallel(m2, collectives=ctx.collectives, bucket_cap_mb=TINY_BUCKETS_MB,
                                   static_graph=True)
    local = copy.deepcopy(m2)
    out = []
    for step in range(2):  # the first backward counts the firings, the second uses the count
        for mod in (m2, local):
            mod.zero_grad(set_to_none=True)
        F.mse_loss(ddp2(x * (step + 1)), y).backward()
        F.mse_loss(local(x * (step + 1)), y).backward()
        out.append({"ddp": _grads(m2), "local": _grads(local)})
    return {"first": first, "steps": out}


def test_hook_firing_twice_keeps_both_contributions_with_and_without_static_graph(world2):
    results = world2.run(task_hook_fires_twice, timeout=120)
    _assert_replicas_hold_the_mean([r["first"] for r in results], atol=1e-6)
    for step in range(2):
        _assert_replicas_hold_the_mean([r["steps"][step] for r in results], atol=1e-6)


# --- the kit's out-of-place comm hook (feature.comm_hook_out_of_place) -------

def task_out_of_place_hook(ctx):
    import torch

    from conformance.cases.shared.setups import out_of_place_mean_hook

    class Bucket:  # the part of torch.distributed.GradBucket the hook reads
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    local = torch.arange(6, dtype=torch.float32) * (ctx.rank + 1)
    bucket = Bucket(local.clone())
    value = out_of_place_mean_hook(None, bucket).wait()
    return {"value": value.numpy().copy(), "buffer": bucket.buffer().numpy().copy(),
            "local": local.numpy().copy(), "same": value.data_ptr() == bucket.buffer().data_ptr()}


def test_out_of_place_hook_returns_the_mean_as_a_new_tensor(world2):
    results = world2.run(task_out_of_place_hook, timeout=60)
    mean = np.mean([r["local"] for r in results], axis=0)
    for r in results:
        np.testing.assert_allclose(r["value"], mean, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(r["buffer"], r["local"])  # the bucket buffer is untouched
        assert not r["same"]


def task_broadcast_many(ctx):
    """Rank-dependent dense tensors of several dtypes and layouts, broadcast from rank 0 at once."""
    import torch
    from ddp_impl.runtime.collectives import broadcast_many
    r = ctx.rank + 1
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4) * r
    tensors = [torch.arange(5, dtype=torch.float32) * r,   # float32, two of them: one packed broadcast
               base.t(),                                   # a strided (transposed) float64 view
               torch.full((2, 3), r, dtype=torch.int64),
               torch.tensor([r % 2 == 0, True]),           # bool
               torch.ones(3, dtype=torch.complex64) * (r + 1j),
               torch.arange(4, dtype=torch.float32).reshape(2, 2) * -r]
    strides = [t.stride() for t in tensors]
    versions = [t._version for t in tensors]
    broadcast_many(ctx.collectives, tensors, src=0)
    return {"values": [t.resolve_conj().numpy().copy() for t in tensors],
            "strides_kept": strides == [t.stride() for t in tensors],
            "versions_kept": versions == [t._version for t in tensors],
            "base": base.numpy().copy()}


def test_broadcast_many_gives_every_replica_rank_0_s_values_in_place(world2):
    """The reference DDP's coalesced module-state and buffer broadcast (one per dtype): every
    tensor ends with rank 0's value, in place (a view writes through to its base), whatever its
    dtype or layout."""
    results = world2.run(task_broadcast_many, timeout=60)
    want = results[0]["values"]
    assert want[0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # rank 0's own values (r = 1)
    for r in results[1:]:
        for got, ref in zip(r["values"], want):
            np.testing.assert_array_equal(got, ref)
        np.testing.assert_array_equal(r["base"], results[0]["base"])
    assert all(r["strides_kept"] for r in results)
    # as upstream's coalesced broadcast: no version bump, so a tensor a pending backward saved (an
    # int64 position-ids buffer under an Embedding, broadcast by a no_grad forward) stays valid
    assert all(r["versions_kept"] for r in results)


# --- the end of backward is found through any output structure ---------------

def task_dataclass_output_with_checkpointed_head(ctx):
    """A model returning a plain dataclass whose last layer runs under reentrant activation
    checkpointing: the head's gradient hooks fire inside the checkpoint's own backward, so only
    the output's sink can put the end-of-backward callback on the outermost backward."""
    import copy
    import dataclasses

    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    from ddp_impl import DistributedDataParallel

    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.head = torch.nn.Linear(10, 8), torch.nn.Linear(8, 4)

        def forward(self, x):
            return Out(checkpoint(self.head, torch.tanh(self.stem(x)), use_reentrant=True))

    torch.manual_seed(3)
    m = Net()
    ddp = DistributedDataParallel(m, collectives=ctx.collectives)
    local = copy.deepcopy(m)
    x, y = _batch(ctx.rank, 0)
    F.mse_loss(ddp(x).logits, y).backward()
    F.mse_loss(local(x).logits, y).backward()
    return {"ddp": _grads(m), "local": _grads(local)}


def test_dataclass_output_reaches_the_outermost_backward(world2):
    results = world2.run(task_dataclass_output_with_checkpointed_head, timeout=60)
    _assert_replicas_hold_the_mean(results, lookup("cpu", "linear").atol)
