"""Faulty DDP (k): a parameter used only in earlier micro-steps is treated as unused.

Fault: with ``find_unused_parameters`` the used-parameter map is reset at every backward, so a
parameter whose gradient was accumulated under ``no_sync`` but not touched in the synced
micro-step counts as globally unused: its accumulated gradient is never averaged and every
replica steps on its own local sum.
Modelled on: pytorch/pytorch#69031 ("DDP only syncs parameters used in most recent pass when
find_unused_parameters is True") https://github.com/pytorch/pytorch/issues/69031 , fixed by
pytorch/pytorch#124193; mosaicml/composer#9.
Exposed by: unused parameters x no_sync (a model whose used set changes between micro-steps).
"""

from .correct_ddp import CorrectDDP


class UnusedInAccumulationDDP(CorrectDDP):
    def _on_grad(self, p):
        if not getattr(self, "_in_backward", False):
            self._in_backward = True
            self._local_used = set()  # bug: forgets the micro-steps before this backward
            import torch
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        super()._on_grad(p)

    def _end_backward(self):
        self._in_backward = False
