"""Module-axis fault 3 (issue 25 item 6): the construction-time broadcast walks
``named_parameters()`` and skips names containing ``parametrizations`` (taking them for derived
tensors), so ``<m>.parametrizations.weight.original`` is never broadcast from rank 0: replicas
built from different seeds keep different underlying weights. Gradients are reduced for every
parameter (the mean is right, the starting points differ).

Module dimension: a module with ``torch.nn.utils.parametrize`` / ``parametrizations`` (weight
norm, orthogonal, spectral norm). Modelled on
reports of DDP mishandling reparametrized modules (pytorch/pytorch#61470, weight_norm with
DDP). Everything else is ``module_axis_correct.Class``.
"""

import torch

from tests.outside.module_axis_correct import Class as _Correct


class Class(_Correct):
    def _initial_broadcast(self):
        state = [p for n, p in self.module.named_parameters()
                 if "parametrizations" not in n]  # FAULT: original tensors skipped
        if self.broadcast_buffers:
            state += list(self.module.buffers())
        with torch.no_grad():
            for t in state:
                self._broadcast(t)
