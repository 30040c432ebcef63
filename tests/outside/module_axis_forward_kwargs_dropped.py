"""Module-axis fault 1 (issue 25 item 6): ``forward(*args, **kwargs)`` calls the wrapped module
with the positional arguments only; keyword arguments to forward are silently dropped.

Module dimension: a forward taking keyword arguments (``scale=``, ``mask=``, ``labels=``) with
defaults: the module then silently computes something else (its default). Modelled on
wrappers whose forward passes only ``*inputs`` on (e.g. KevinMusgrave/pytorch-metric-learning#701:
a distributed wrapper's forward not taking the wrapped module's keyword arguments). Everything else is
``module_axis_correct.Class``.
"""

from tests.outside.module_axis_correct import Class as _Correct


class Class(_Correct):
    def _call_module(self, inputs, kwargs):
        return self.module(*inputs)  # FAULT: kwargs dropped
