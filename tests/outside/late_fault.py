"""Faulty DDP (o): a fault that starts late: synchronisation lost from step 41 on.

Fault: the first 40 synced steps are exact; from the 41st on the reduction is skipped and every
replica steps on its local gradient (no error, no hang: no collective is issued by anyone).
Modelled on: pytorch/pytorch#72843 and #44798 (DDP changes behaviour after the first iterations
when buckets are rebuilt; a training that hung or desynchronised only later)
https://github.com/pytorch/pytorch/pull/72843 .
Exposed by: run length (any check of >= 41 steps); a 20-step run cannot see it.
"""

from .correct_ddp import CorrectDDP

FIRST_BAD_STEP = 41  # 1-based synced step from which gradients are no longer reduced


class LateFaultDDP(CorrectDDP):
    _steps = 0

    def _reduce(self):
        self._steps += 1
        if self._steps >= FIRST_BAD_STEP:
            self._queued, self._local_used, self._join_work = False, set(), None
            return
        super()._reduce()
