"""Faulty backend: ``barrier`` never completes on the last rank (its ``Work.wait`` blocks, as a
lost message would); the other ranks wait in gloo's barrier for it. The kit must report it
within the case's bound, not hang."""
from __future__ import annotations

import threading

from tests.outside.backends.wrapper import Wrapper, registrar


class NeverDone:
    """A ``Work``-like handle whose ``wait()`` never returns (an Event nobody sets)."""

    def wait(self, timeout=None):
        threading.Event().wait()

    def is_completed(self):
        return False


class HangBarrier(Wrapper):
    NAME = "hang_barrier"

    def barrier(self, opts):
        if self.rank() == self.size() - 1:
            return self._run("barrier", NeverDone(), [], opts)
        return super().barrier(opts)


register = registrar(HangBarrier)
