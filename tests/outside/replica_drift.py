"""Faulty DDP (n): slow replica drift.

Fault: from the second synced step on, replica r multiplies its reduced gradient by
(1 + 1e-6 * r); replica 0 is exact, the others drift apart from it by a relative 1e-6 per step.
Modelled on: pytorch/pytorch#112152 ("DDP backpropagated gradients not the same across all gpus")
https://github.com/pytorch/pytorch/issues/112152 and HorizonRobotics/alf#1475 (a periodic
cross-replica parameter-consistency check was needed to find such drift).
Exposed by: replica agreement (every replica's parameters compared with replica 0's / the
reference), not rank 0 alone; a tolerance below 1e-6 relative, or enough steps.
"""

from .correct_ddp import CorrectDDP

DRIFT_PER_RANK = 1e-6  # relative gradient error of replica r is DRIFT_PER_RANK * r


class ReplicaDriftDDP(CorrectDDP):
    _steps = 0

    def _reduce_bucket(self, b, idx, divisor):
        out = super()._reduce_bucket(b, idx, divisor)
        return out * (1 + DRIFT_PER_RANK * self.rank) if self._steps >= 1 else out

    def _reduce(self):
        super()._reduce()
        self._steps += 1
