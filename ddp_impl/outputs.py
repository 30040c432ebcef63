"""The tensors of a module's forward output, walked as torch's DDP walks them for its hooks
(``torch/nn/parallel/distributed.py`` ``_DDPSink`` and ``_find_tensors``: tensors, dicts, lists,
tuples, namedtuples and dataclasses, any nesting). ``torch.utils._pytree`` stops at a plain
dataclass, which a model may return; this walk enters it."""
from __future__ import annotations

import dataclasses

import torch


def output_tensors(out, fn=None):
    """The tensors of ``out`` in walk order (a list); with ``fn``, ``out`` rebuilt with each tensor
    ``t`` replaced by ``fn(t)`` instead. Containers keep their type; a dict subclass whose
    constructor takes other arguments (``defaultdict``) comes back a ``dict``; a dataclass is rebuilt
    with ``dataclasses.replace`` (fields with ``init=False`` keep their values). Anything else is
    a leaf returned unchanged."""
    found = []
    rebuilt = _walk(out, fn, found)
    return rebuilt if fn else found


def _walk(o, fn, found: list):
    # Module-level, not a closure: a self-referencing nested function is a reference cycle that
    # keeps the walked tensors alive until the cyclic collector runs, and on XLA a live tensor is
    # a graph output, so replicas would compile different graphs.
    if isinstance(o, torch.Tensor):
        found.append(o)
        return fn(o) if fn else o
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        vals = {f.name: _walk(getattr(o, f.name), fn, found) for f in dataclasses.fields(o)}
        return dataclasses.replace(o, **{f.name: vals[f.name] for f in dataclasses.fields(o) if f.init})
    if isinstance(o, dict):
        pairs = [(k, _walk(v, fn, found)) for k, v in o.items()]
        try:
            return type(o)(pairs)
        except TypeError:
            return dict(pairs)
    if isinstance(o, tuple) and hasattr(o, "_fields"):
        return type(o)(*(_walk(v, fn, found) for v in o))
    if isinstance(o, (list, tuple)):
        return type(o)(_walk(v, fn, found) for v in o)
    return o
