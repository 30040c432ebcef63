"""Faulty DDP (d): ``static_graph=True`` skips the reduction of the first iteration.

Fault: with ``static_graph=True`` the first backward only records the graph and leaves every
replica with its local gradient (no all-reduce); from the second iteration on it is correct.
Modelled on: Lightning-AI/pytorch-lightning#18086 ("Gradients seem not synchronized with manual
optimization and DDPStrategy with static_graph=True": the first iteration's delayed all-reduce
never ran) https://github.com/Lightning-AI/pytorch-lightning/issues/18086 , fixed by #21251;
static-graph first-iteration logic: pytorch/pytorch#55248.
Exposed by: the static_graph dimension (param parity at step 1 of a static_graph run).
"""

from .correct_ddp import CorrectDDP


class StaticGraphFirstIterDDP(CorrectDDP):
    def _reduce(self):
        if self.static_graph and not getattr(self, "_graph_recorded", False):
            self._graph_recorded = True
            self._queued = False
            self._local_used = set()
            self._join_work = None
            return
        super()._reduce()
