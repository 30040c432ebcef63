"""Fault 25.3: a parameter no replica used gets ``grad = None``, even when it held a zero tensor.

Training loop dimension: ``optimizer.zero_grad(set_to_none=False)`` with
``find_unused_parameters=True`` and a parameter unused by every replica in a step, under an
optimizer for which a ``None`` and a zero gradient differ (SGD with weight decay or momentum:
a zero gradient still decays the weight / moves it by the momentum buffer, ``None`` skips it).

torch's DDP leaves such a gradient untouched (``None`` stays ``None``, a zeroed tensor stays a
zeroed tensor). This DDP "resets" every globally unused parameter's gradient to ``None`` after
the reduction (as a wrapper that assumes ``zero_grad(set_to_none=True)`` would), so the optimizer
skips a weight that torch decays. Everything else is ``CorrectDDP``.
"""

from tests.outside.correct_ddp import CorrectDDP


class UnusedZeroToNoneDDP(CorrectDDP):
    def _used_counts(self, joined):
        used = super()._used_counts(joined)
        if not joined and (self.find_unused_parameters or self.static_graph):
            for i, p in enumerate(self._params):
                if used[i] < 1:
                    p.grad = None  # FAULT: an unused zero gradient becomes None
        return used
