"""Module-axis fault 5 (issue 25 item 6): with ``broadcast_buffers=False`` the construction-time
broadcast of the *parameters* is skipped too (one ``if self.broadcast_buffers`` around the whole
initial sync): replicas built from different seeds then stay different (the averaged gradient
moves them in parallel).

Initial-state dimension: replicas whose modules start from different values (per-rank seeds)
and ``broadcast_buffers=False``. Modelled on pytorch/pytorch#111138 (torch 2.1 changed the
broadcast of module states when ``broadcast_buffers=False``). Everything else is
``module_axis_correct.Class``.
"""

import torch

from tests.outside.module_axis_correct import Class as _Correct


class Class(_Correct):
    def _initial_broadcast(self):
        if not self.broadcast_buffers:
            return  # FAULT: parameters not broadcast either
        with torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                self._broadcast(t)
