"""Coverage said out loud (issue 29 item 1): performance-only keywords a DDP refuses cost only
the cases about them, and the summary, JSON and HTML say what share was certified and what the
unsupported verdicts cost, grouped by cause."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance.cases.table import CASES
from conformance.evaluate import evaluate


class MinimalDDP(nn.Module):
    """A tiny correct DDP from scratch: broadcast at construction, all-reduce mean after
    backward (no buckets). Refuses every keyword but ``broadcast_buffers``, as the README asks."""

    def __init__(self, module, broadcast_buffers=True, **kwargs):
        if kwargs:
            raise TypeError(f"MinimalDDP got unexpected keyword argument {sorted(kwargs)[0]!r}")
        super().__init__()
        self.module, self.broadcast_buffers = module, broadcast_buffers
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, 0)
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._sync)

    @staticmethod
    def _sync(p):
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

    def forward(self, *a, **k):
        if self.broadcast_buffers and torch.is_grad_enabled():
            for b in self.module.buffers():
                dist.broadcast(b.data, 0)
        return self.module(*a, **k)


IMPL = f"{__name__}:MinimalDDP"


@pytest.mark.cpu
def test_refused_performance_hint_still_runs_parity_mlp(conformance_session):
    """parity.mlp passes bucket_cap_mb (a performance hint): a DDP refusing it still gets the
    case run and passed; feature.bucket_view, which requires the bucket keywords, stays
    unsupported with the refusal as its reason."""
    got = evaluate(CASES["parity.mlp"], IMPL, "cpu", 2, conformance_session, shrink=False)
    assert got and {v.status for v in got} == {"pass"}, [(v.check, v.status, v.reason) for v in got]
    got = evaluate(CASES["feature.bucket_view"], IMPL, "cpu", 2, conformance_session, shrink=False)
    assert {v.status for v in got} == {"unsupported"}
    assert "refuses keyword gradient_as_bucket_view" in got[0].reason or "bucket_cap_mb" in got[0].reason
