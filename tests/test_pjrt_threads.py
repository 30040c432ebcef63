"""Emulated hosts on every thread that works for a PJRT replica (issue 26, item 5): autograd runs
an XLA backward's hooks and end-of-backward callbacks on its own device thread, so the per-host
queries are keyed by the replica's device (conformance.worlds.runtimes.pjrt_hosts), not by the
replica's thread."""
import threading

import pytest

from conformance.cases.table import CASES
from conformance.evaluate import evaluate
from conformance.settings import Settings
from conformance.verdict import BAD
from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime
from conformance.worlds.spawned import World


def _pjrt(w):
    try:
        get_runtime("pjrt").check(w)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")


def autograd_thread_answers(ctx):
    """Per-host answers and thread of the replica thread, a post-accumulate-grad hook, a tensor
    hook and a queued end-of-backward callback, for one XLA backward."""
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    seen = {}

    def rec(tag):
        seen[tag] = (threading.get_ident(), xr.process_index(), xr.addressable_device_count(),
                     xr.local_ordinal(), xm.get_local_ordinal())

    rec("replica")
    w = torch.nn.Parameter(torch.ones(3, device=ctx.device))
    w.register_post_accumulate_grad_hook(lambda p: rec("post_accumulate_grad_hook"))
    w.register_hook(lambda g: (rec("tensor_hook"),
                               torch.autograd.Variable._execution_engine.queue_callback(
                                   lambda: rec("queue_callback")))[0])
    (w * 2).sum().backward()
    ctx.mark_step()
    return seen


@pytest.mark.pjrt
@pytest.mark.parametrize("w,hosts", [(2, 2), (4, 2)], ids=["w2-2x1", "w4-2x2"])
def test_per_host_answers_hold_on_autograd_threads(w, hosts):
    _pjrt(w)
    with World("pjrt", w, timeout=120, settings=Settings(pjrt_hosts=((w, hosts),))) as world:
        got = world.run(autograd_thread_answers)
    per_host = w // hosts
    for o, seen in enumerate(got):
        assert set(seen) == {"replica", "post_accumulate_grad_hook", "tensor_hook", "queue_callback"}, seen
        h, local = divmod(o, per_host)
        for tag, (_, *answers) in seen.items():
            assert answers == [h, per_host, local, local], (o, tag, answers)
        # the measured reason for keying by device: the hooks run on another thread
        assert seen["post_accumulate_grad_hook"][0] != seen["replica"][0], (o, seen)


XLA_DDPS = "tests.outside.xla_callback_divisor"


@pytest.mark.pjrt
@pytest.mark.parametrize("faulty", ["XlaCallbackLocalDivisorDDP", "XlaHookLocalDivisorDDP"])
def test_an_xla_ddp_reading_the_host_in_autograd_threads_fails_on_two_hosts(faulty, conformance_session):
    """W=2 is 2 emulated hosts x 1: the divisor read in a hook or callback is 1, not 2; the correct
    sibling (xr.world_size() in the same callback) passes."""
    _pjrt(2)
    case = CASES["parity.linear"]
    bad = evaluate(case, f"{XLA_DDPS}:{faulty}", "pjrt", 2, conformance_session, shrink=False)
    good = evaluate(case, f"{XLA_DDPS}:XlaCallbackDDP", "pjrt", 2, conformance_session, shrink=False)
    assert [v.status for v in good] == ["pass"] * len(good), [(v.check, v.status, v.reason) for v in good]
    assert {v.check for v in bad if v.status in BAD} >= {"param_parity", "loss_parity"}, \
        [(v.check, v.status) for v in bad]
