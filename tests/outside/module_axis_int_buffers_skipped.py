"""Module-axis fault 2 (issue 25 item 6): buffer broadcasts (construction and before each
training forward) send only floating-point buffers; integer (and bool / complex) buffers such as
a step counter or BatchNorm's ``num_batches_tracked`` stay per replica.

Module dimension: integer buffers whose value can differ between replicas (a data-dependent
counter, or a counter differing at construction). Modelled on
buffer syncs that filter ``buf.is_floating_point()`` to fit a float-only flat fusion buffer, on
the reasoning of pytorch/pytorch#63916 ("``num_batches_tracked`` is always the same across ranks
anyways"). Everything else is ``module_axis_correct.Class``.
"""

import torch

from tests.outside.module_axis_correct import Class as _Correct


class Class(_Correct):
    def _initial_broadcast(self):
        state = list(self.module.parameters())
        if self.broadcast_buffers:
            state += [b for b in self.module.buffers() if b.is_floating_point()]  # FAULT
        with torch.no_grad():
            for t in state:
                self._broadcast(t)

    def _synced_buffers(self):
        return [b for b in self.module.buffers() if b.is_floating_point()]  # FAULT
