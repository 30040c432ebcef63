"""A parameter this replica did not use keeps ``grad = None`` after the reduction.

Model dimension: ``find_unused_parameters=True`` with a branch only some replicas use. torch's
DDP writes the reduced mean into every parameter some replica used, so a replica that skipped the
branch gets the other replicas' share. This DDP writes back only where the replica already holds
a gradient (the ``if p.grad is not None`` guard of many hand-written all-reduce loops): the
replica that skipped the branch keeps ``None``, and its optimizer skips the branch's weights.
Everything else is ``CorrectDDP``.
"""

from tests.outside.correct_ddp import CorrectDDP


class GradLeftNoneDDP(CorrectDDP):
    def _write_back(self, b, idx, flat, used):
        had = {i for i in idx if self._params[i].grad is not None}
        super()._write_back(b, idx, flat, used)
        for i in idx:
            if i not in had:
                self._params[i].grad = None  # FAULT: no local gradient, no reduced one either
