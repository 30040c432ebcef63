"""Faulty DDP (m): buffer list cached at construction.

Fault: the buffers to broadcast before each forward are collected once, in the constructor; a
model that rebinds a buffer in ``forward`` (``self.buf = self.buf * m + x``) gets the stale,
detached tensor broadcast, so replicas' live buffers are never synchronised.
Modelled on: pytorch/pytorch#63916 ("Issues when using buffers with DDP": reassigning a buffer
leaves DDP's cached module buffers pointing at the old tensor)
https://github.com/pytorch/pytorch/issues/63916 .
Exposed by: buffer parity of a model that rebinds (not updates in place) a buffer in forward.
BatchNorm updates running stats in place, so it cannot expose this.
"""

import torch

from .correct_ddp import CorrectDDP


class CachedBuffersDDP(CorrectDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._cached_buffers = list(module.buffers())

    def _sync_buffers(self, joined):
        if not self._cached_buffers:
            return
        src = self._buffer_source(joined)
        with torch.no_grad():
            for b in self._cached_buffers:
                self._broadcast(b, src)
