"""Fault 25.7: buffers are broadcast from ``module.state_dict()``.

Module dimension: a buffer registered with ``persistent=False`` (a cached mask, running
statistics kept out of checkpoints, a rotary-embedding table).

Horovod's documented recipe is ``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``;
this DDP does the same for its buffer broadcasts (at construction and before each synced
forward): it takes the buffers from ``state_dict(keep_vars=True)``, which leaves out
non-persistent buffers. torch's DDP broadcasts ``module.buffers()``, non-persistent ones
included, so a non-persistent buffer that diverges across replicas (updated from local data
in ``forward``, or initialised per rank) stays different here. Everything else is
``CorrectDDP``.
"""

import torch
from torch import nn

from tests.outside.correct_ddp import CorrectDDP


def _state_dict_buffers(module):
    params = {id(p) for p in module.parameters()}
    return [t for t in module.state_dict(keep_vars=True).values()
            if isinstance(t, torch.Tensor) and id(t) not in params]


class StateDictBuffersDDP(CorrectDDP):
    def __init__(self, module, broadcast_buffers=True, init_sync=True, **kwargs):
        super().__init__(module, broadcast_buffers=broadcast_buffers, init_sync=False, **kwargs)
        if init_sync:
            state = list(module.parameters())
            if self.broadcast_buffers:
                state += _state_dict_buffers(module)  # FAULT: non-persistent buffers left out
            with torch.no_grad():
                for t in state:
                    self._broadcast(t, 0)

    def _sync_buffers(self, joined):
        bufs = _state_dict_buffers(self.module)  # FAULT: non-persistent buffers left out
        if not bufs:
            return
        src = self._buffer_source(joined)
        with torch.no_grad():
            seen = set()
            for b in bufs:
                if id(b) not in seen:
                    seen.add(id(b))
                    self._broadcast(b, src)
