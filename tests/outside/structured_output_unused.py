"""Fault 25.6: with ``find_unused_parameters``, output tensors are looked for in tensors,
tuples and lists only; a dict or dataclass output counts as "no output tensors".

Module dimension: ``forward`` returns a ``dict`` / dataclass / ``NamedTuple``-less structure
(``ModelOutput``-style) and the DDP runs with ``find_unused_parameters=True``.

torch's DDP finds the output tensors in any pytree (``_find_tensors`` handles dicts and, since
torch 1.11, dataclasses) to see which parameters the forward reached. This DDP's search knows
only ``Tensor``/``tuple``/``list``; when it finds no tensor it concludes the forward used no
parameter on this replica, so every parameter is reported unused: with every replica returning
a dict, nothing is reduced and each replica keeps its local gradient. Tensor and tuple outputs,
and runs without ``find_unused_parameters``, behave as ``CorrectDDP``.
"""

import torch

from tests.outside.correct_ddp import CorrectDDP


def _find_tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _find_tensors(o)]
    return []  # FAULT: dict, dataclass and other containers are not searched


class StructuredOutputUnusedDDP(CorrectDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._outputs_found = True

    def forward(self, *inputs, **kwargs):
        out = super().forward(*inputs, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync \
                and (self.find_unused_parameters and not self.static_graph):
            self._outputs_found = bool(_find_tensors(out))
        return out

    def _used_counts(self, joined):
        if not joined and not self._outputs_found:
            self._local_used = set()  # FAULT: no output tensor found -> "every parameter unused"
        return super()._used_counts(joined)
