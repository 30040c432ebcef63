"""Module-axis fault 6 (issue 25 item 6): with ``find_unused_parameters=True`` the output
tensors (from which the autograd graph is walked to find the used parameters) are looked for in
a tensor, a plain tuple/list or a dict only, not in a namedtuple or a dataclass: parameters
reached only through such outputs are marked unused on every replica and their gradients are
never reduced (each replica keeps its local gradient).

Module dimension: forward returns a ``NamedTuple`` or a dataclass (``ModelOutput``-style),
``find_unused_parameters=True``. Modelled on
pytorch/pytorch#22436 (DDP "wasn't able to locate the output tensors in the return value of your
module's forward"). Everything else is
``module_axis_correct.Class``.
"""

import torch

from tests.outside.module_axis_correct import Class as _Correct


def _find_tensors(obj):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if type(obj) in (tuple, list):  # FAULT: a namedtuple is not exactly a tuple
        return [t for v in obj for t in _find_tensors(v)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _find_tensors(v)]
    return []  # FAULT: dataclasses not searched


class Class(_Correct):
    def _output_tensors(self, out):
        return _find_tensors(out)
