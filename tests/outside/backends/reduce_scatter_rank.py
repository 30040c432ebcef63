"""Faulty backend: on the last rank, ``reduce_scatter`` (list and tensor form) returns that
rank's own input chunk, not the reduction of every rank's chunk. The other ranks are right."""
from __future__ import annotations

from tests.outside.backends.wrapper import DoneWork, Wrapper, registrar


class ReduceScatterRank(Wrapper):
    NAME = "reduce_scatter_rank"

    def _last(self):
        return self.rank() == self.size() - 1

    def reduce_scatter(self, outputs, input_lists, opts):
        work = super().reduce_scatter(outputs, input_lists, opts)
        if self._last():
            outputs[0].copy_(input_lists[0][self.rank()])
        return DoneWork(outputs)

    def _reduce_scatter_base(self, output, input, opts):
        work = super()._reduce_scatter_base(output, input, opts)
        if self._last():
            k = output.numel()
            output.copy_(input.reshape(-1)[self.rank() * k:(self.rank() + 1) * k])
        return DoneWork([output])

    reduce_scatter_single = _reduce_scatter_base


register = registrar(ReduceScatterRank)
