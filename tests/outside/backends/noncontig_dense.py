"""Faulty backend: ``reduce_scatter_tensor`` reads a non-contiguous input as if it were
contiguous: it hands gloo a dense view of the input's memory (its first ``numel`` elements from
the storage offset), as a backend that takes ``data_ptr()`` and ``numel()`` of its flat input
without checking the strides does. gloo's own ``reduce_scatter_tensor`` is right on such an
input (its all_reduce, broadcast, reduce and scatter are not: finding 13, upstream
pytorch/pytorch#192920); every other op of this backend is gloo's."""
from __future__ import annotations

import torch

from tests.outside.backends.wrapper import Wrapper, registrar


def dense_read(t):
    """The first ``t.numel()`` elements of ``t``'s memory, in ``t``'s shape (``t`` if dense)."""
    if t.is_contiguous() or t.numel() == 0:
        return t
    if t.storage_offset() + t.numel() > t.untyped_storage().nbytes() // t.element_size():
        return t.contiguous()  # past the end of the memory: a real backend would read garbage
    return t.as_strided(t.shape, torch.empty(t.shape).stride(), t.storage_offset())


class NoncontigDense(Wrapper):
    NAME = "noncontig_dense"

    def _reduce_scatter_base(self, output, input, opts):
        return super()._reduce_scatter_base(output, dense_read(input), opts)

    reduce_scatter_single = _reduce_scatter_base  # torch >= 2.10 calls this name


register = registrar(NoncontigDense)
