"""Unit tests of the reference DDP's semantics against a recording fake of the
collective interface (no runtime needed)."""
import gc
import warnings
import weakref

import pytest
import torch
from torch import nn

from ddp_impl import DistributedDataParallel

pytestmark = pytest.mark.cpu


class RecordingCollectives:
    """Two-replica world where the other replica always holds ``other`` times ours."""

    rank, world_size = 0, 2

    def __init__(self, other=3.0):
        self.other, self.calls = other, []

    def all_reduce_(self, t, *, scale=1.0):
        self.calls.append(("all_reduce", tuple(t.shape), scale))
        return t.mul_((1 + self.other) * scale)

    def broadcast_(self, t, src=0):
        self.calls.append(("broadcast", tuple(t.shape), src))
        return t

    def all_gather(self, t):
        return [t, t * self.other]

    def barrier(self):
        pass


def make(**kw):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    coll = RecordingCollectives()
    return DistributedDataParallel(net, collectives=coll, **kw), coll


def test_construction_broadcasts_every_parameter_and_buffer():
    ddp, coll = make()
    n = len(list(ddp.module.parameters())) + len(list(ddp.module.buffers()))
    assert [c[0] for c in coll.calls] == ["broadcast"] * n
    assert all(c[2] == 0 for c in coll.calls)


def test_gradients_are_all_reduced_to_the_mean():
    ddp, coll = make(broadcast_buffers=False)
    coll.calls.clear()
    x = torch.randn(5, 3)
    ddp(x).sum().backward()
    reduces = [c for c in coll.calls if c[0] == "all_reduce"]
    assert len(reduces) == len(ddp._buckets) == 1  # a small model: one bucket
    assert {c[2] for c in reduces} == {0.5}
    # the fake's other replica holds 3x our gradient: the mean is 2x ours
    ref = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    ref.load_state_dict(ddp.module.state_dict())
    ref(x).sum().backward()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, 2 * q.grad)


def test_buffers_broadcast_when_the_previous_forward_was_synced():
    """Upstream's require_forward_param_sync: buffers are broadcast before a forward
    that follows a synced training forward (or none); a forward without grad or
    inside no_sync turns it off for the next one."""
    ddp, coll = make()
    nbuf = len(list(ddp.module.buffers()))

    def broadcasts(fn):
        coll.calls.clear()
        fn()
        return sum(c[0] == "broadcast" for c in coll.calls)
    assert broadcasts(lambda: ddp(torch.randn(4, 3))) == nbuf          # first forward
    with torch.no_grad():
        assert broadcasts(lambda: ddp(torch.randn(4, 3))) == nbuf      # previous was synced
    assert broadcasts(lambda: ddp(torch.randn(4, 3))) == 0             # previous had no grad
    with ddp.no_sync():
        assert broadcasts(lambda: ddp(torch.randn(4, 3))) == nbuf      # window starts: synced before
        assert broadcasts(lambda: ddp(torch.randn(4, 3))) == 0         # inside the window
    assert broadcasts(lambda: ddp(torch.randn(4, 3))) == 0             # the window's synced micro-step
    assert broadcasts(lambda: ddp(torch.randn(4, 3))) == nbuf          # next window


def test_no_sync_accumulates_then_reduces_once():
    ddp, coll = make(broadcast_buffers=False)
    coll.calls.clear()
    with ddp.no_sync():
        ddp(torch.randn(4, 3)).sum().backward()
    assert coll.calls == []
    ddp(torch.randn(4, 3)).sum().backward()
    assert len(coll.calls) == len(ddp._buckets)


def test_ignored_kwargs_are_named_in_one_warning():
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ddp, _ = make(check_reduction=True, dim=0, bucket_cap_mb=1, static_graph=True,
                      gradient_as_bucket_view=True)
    msgs = [str(w.message) for w in rec if issubclass(w.category, UserWarning)]
    assert len(msgs) == 1 and "check_reduction=True" in msgs[0] and "dim=0" in msgs[0]
    assert ddp.ignored_kwargs == {"check_reduction": True, "dim": 0}  # honoured ones are not listed


def test_unknown_kwarg_is_a_type_error():
    with pytest.raises(TypeError, match="bucket_size"):
        make(bucket_size=3)


def test_collectives_and_process_group_are_exclusive():
    with pytest.raises(TypeError, match="not both"):
        DistributedDataParallel(nn.Linear(2, 2), collectives=RecordingCollectives(), process_group=object())


def test_without_runtime_a_clear_error():
    with pytest.raises(RuntimeError, match="not initialised"):
        DistributedDataParallel(nn.Linear(2, 2))


def mlp():
    torch.manual_seed(0)  # weights of 64x64 floats: 16 KiB each
    return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64))


def test_buckets_follow_cap_in_reverse_registration_order():
    net = mlp()
    ddp = DistributedDataParallel(net, collectives=RecordingCollectives(), bucket_cap_mb=16 / 1024)
    names = {id(p): n for n, p in net.named_parameters()}
    got = [[names[id(p)] for p in b.params] for b in ddp._buckets]
    # a bucket closes once it holds >= 16 KiB: at every weight, walking backwards
    assert got == [["4.bias", "4.weight"], ["2.bias", "2.weight"], ["0.bias", "0.weight"]]
    assert [b.flat.numel() for b in ddp._buckets] == [64 * 65] * 3
    default = DistributedDataParallel(mlp(), collectives=RecordingCollectives())
    assert len(default._buckets) == 1  # 25 MiB (first bucket 1 MiB) holds the whole model


def test_one_all_reduce_per_bucket_in_bucket_order():
    ddp = DistributedDataParallel(mlp(), collectives=RecordingCollectives(), bucket_cap_mb=16 / 1024)
    ddp.collectives.calls.clear()
    ddp(torch.randn(5, 64)).sum().backward()
    assert ddp.collectives.calls == [("all_reduce", (64 * 65,), 0.5)] * 3


def test_gradient_as_bucket_view_makes_grads_bucket_views():
    ddp = DistributedDataParallel(mlp(), collectives=RecordingCollectives(), bucket_cap_mb=16 / 1024,
                                  gradient_as_bucket_view=True)
    x = torch.randn(5, 64)
    ddp(x).sum().backward()
    first = {n: p.grad.clone() for n, p in ddp.module.named_parameters()}
    for b in ddp._buckets:
        for p in b.params:
            flat = b.flat
            assert flat.data_ptr() <= p.grad.data_ptr() < flat.data_ptr() + flat.numel() * flat.element_size()
    ddp(x).sum().backward()  # accumulates into the views, then reduces them in place
    for n, p in ddp.module.named_parameters():
        torch.testing.assert_close(p.grad, 3 * first[n])  # (2g + g) * (1 + 3) / 2


class Skippy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, skip_b=False):
        return self.a(x) if skip_b else self.b(self.a(x))


def test_parameter_without_gradient_raises_naming_it():
    ddp = DistributedDataParallel(Skippy(), collectives=RecordingCollectives())
    with pytest.raises(RuntimeError, match=r"b\.weight.*find_unused_parameters=True"):
        ddp(torch.randn(5, 4), skip_b=True).sum().backward()
    ddp.module.zero_grad(set_to_none=True)
    ddp.collectives.calls.clear()
    ddp(torch.randn(5, 4)).sum().backward()  # the next step is not poisoned
    assert [c[0] for c in ddp.collectives.calls] == ["all_reduce"]


def test_a_dropped_wrapper_is_freed_and_leaves_no_hooks():
    # A hook that held the wrapper strongly made a cycle through the parameters that
    # gc cannot see: every training run of a world's host leaked its whole DDP.
    ddp, _ = make()
    ddp(torch.randn(5, 3)).sum().backward()
    net, gone = ddp.module, weakref.ref(ddp)
    del ddp
    gc.collect()
    assert gone() is None
    assert not any(p._post_accumulate_grad_hooks for p in net.parameters())
    again = DistributedDataParallel(net, collectives=RecordingCollectives(), broadcast_buffers=False)
    again.collectives.calls.clear()
    again(torch.randn(5, 3)).sum().backward()  # the kept module trains under a new wrapper
    assert [c[0] for c in again.collectives.calls] == ["all_reduce"]


def _completed(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


def test_comm_hook_value_is_the_reduced_bucket_and_the_builtin_average_is_off():
    """register_comm_hook: the future's value (a new tensor here) becomes the gradients; the
    buffer the hook saw held this replica's gradients; no built-in all-reduce runs."""
    ddp, coll = make(broadcast_buffers=False)
    seen = []

    def hook(state, bucket):
        seen.append((state, bucket.index(), bucket.is_last(), bucket.buffer().clone(),
                     [tuple(g.shape) for g in bucket.gradients()], len(bucket.parameters())))
        return _completed(bucket.buffer() * 10)  # out of place: the buffer stays as it is

    ddp.register_comm_hook("state", hook)
    coll.calls.clear()
    x = torch.randn(5, 3)
    ddp(x).sum().backward()
    assert not [c for c in coll.calls if c[0] == "all_reduce"]
    ref = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    ref.load_state_dict(ddp.module.state_dict())
    ref(x).sum().backward()
    (state, index, last, local, shapes, n), = seen
    assert (state, index, last, n) == ("state", 0, True, len(list(ref.parameters())))
    assert sorted(shapes) == sorted(tuple(p.shape) for p in ref.parameters())
    want = torch.cat([q.grad.reshape(-1) for q in reversed(list(ref.parameters()))])
    torch.testing.assert_close(local, want)  # the hook saw the local gradients, in bucket order
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, 10 * q.grad)


def test_comm_hook_registration_rules():
    ddp, _ = make()
    with pytest.raises(TypeError, match="callable"):
        ddp.register_comm_hook(None, "not a hook")
    ddp.register_comm_hook(None, lambda s, b: _completed(b.buffer()))
    with pytest.raises(RuntimeError, match="only be called once"):
        ddp.register_comm_hook(None, lambda s, b: _completed(b.buffer()))


def test_comm_hook_on_lazy_list_collectives_is_not_implemented():
    class ListCollectives(RecordingCollectives):  # the XLA collectives' shape
        def all_reduce_many(self, ts, *, scale=1.0):
            return [t * scale for t in ts]

    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Linear(3, 2), collectives=ListCollectives())
    with pytest.raises(NotImplementedError, match="XLA"):
        ddp.register_comm_hook(None, lambda s, b: _completed(b.buffer()))
