"""Faulty backend: an ``all_reduce``'s ``Work.get_future()`` completes when the op is launched,
not when its data is there. The backend reduces into a staging copy and copies the result into
the caller's tensors in ``Work.wait()``; the future it hands out was completed at launch with the
caller's tensors, which still hold the input. A blocking call and ``async_op=True`` followed by
``Work.wait()`` are right; ``async_op=True`` followed by ``get_future().wait()`` (or ``.then``),
which is how torch's DDP waits for its gradient buckets, reads the input. A CPU port of a device
backend, whose futures may be marked done once the work is enqueued on a stream, with the
copy-out left to ``wait()``, fails like this."""
from __future__ import annotations

import torch
import torch.distributed as dist

from tests.outside.backends.wrapper import Wrapper, registrar


class EarlyWork(dist._Work):
    """``get_future()`` is done from the start; ``wait()`` finishes gloo's op and copies out."""

    def __init__(self, inner, staged, outputs, finish):
        super().__init__()
        self._inner, self._staged, self._outputs, self._finish = inner, staged, outputs, finish
        self._done = False
        self._future = torch.futures.Future()
        self._future.set_result(outputs)  # the fault: completed before the data is there

    def wait(self, timeout=None):
        if not self._done:
            self._inner.wait()
            for out, staged in zip(self._outputs, self._staged):
                out.copy_(staged)
            self._finish()
            self._done = True
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return self._future


class EarlyFuture(Wrapper):
    NAME = "early_future"

    def _early(self, launch, tensors, opts):
        staged = [t.clone() for t in tensors]
        work = launch(staged, opts)
        return EarlyWork(work, staged, tensors, lambda: self.fix("allreduce", tensors, opts))

    def allreduce(self, tensors, opts):
        return self._early(self.gloo.allreduce, tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        return self._early(self.gloo.allreduce_coalesced, tensors, opts)


register = registrar(EarlyFuture)
