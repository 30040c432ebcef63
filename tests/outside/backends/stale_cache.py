"""Faulty backend: ``all_reduce`` keeps a staging copy of each tensor it reduced, keyed by the
tensor's storage address, and on a later call on the same storage reduces the staged copy
instead of what the tensor holds now: the first call is right, every later call on that
tensor repeats the first one's result.

A backend that registers or pins a tensor's memory once and then reuses the registration
(user-buffer registration, a cached staging copy for a device without peer access) fails like
this when it misses that the contents changed. DDP all-reduces the same bucket storage at every
step, so the gradients of step 1 come back at every later step.
"""
from __future__ import annotations

from tests.outside.backends.wrapper import Wrapper, registrar


class StaleCache(Wrapper):
    NAME = "stale_cache"

    def __init__(self, store, rank, size, timeout):
        super().__init__(store, rank, size, timeout)
        self._staged = {}

    def allreduce(self, tensors, opts):
        for t in tensors:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype)
            if key in self._staged:
                t.copy_(self._staged[key])  # the staged copy of the first call, not the new contents
            else:
                self._staged[key] = t.clone()
        return super().allreduce(tensors, opts)


register = registrar(StaleCache)
