"""Faulty backend: on a subgroup, the root of ``broadcast``, ``reduce``, ``gather`` and
``scatter`` is taken as a **global** rank. torch hands the backend the root as a group rank
(``opts.rootRank``); this backend maps it through its global-to-group table, falling back to the
number itself when it is no global rank of the group. On the world, and wherever the table and
the fallback agree (group rank 0 of ranks 1..W-1, any root of the even ranks), it is right; on
the group of global ranks 1..W-1 a root at group rank 1 is read as global rank 1, i.e. group
rank 0, so the wrong rank's data goes out (broadcast, scatter) or lands on the wrong rank
(reduce, gather). Registered with torch's extended backend API, which passes
``global_ranks_in_group``."""
from __future__ import annotations

import torch.distributed as dist

from tests.outside.backends.wrapper import Wrapper

ROOTED = ("broadcast", "reduce", "gather", "scatter")


class SubgroupGlobalRanks(Wrapper):
    NAME = "subgroup_global_ranks"

    def __init__(self, store, rank, size, timeout, global_ranks=()):
        super().__init__(store, rank, size, timeout)
        self.group_rank_of = {g: r for r, g in enumerate(global_ranks)}

    def _root(self, opts):
        moved = type(opts)()
        for name in ("asyncOp", "reduceOp", "rootTensor", "timeout"):
            if hasattr(opts, name):
                setattr(moved, name, getattr(opts, name))
        moved.rootRank = self.group_rank_of.get(opts.rootRank, opts.rootRank)  # the fault
        return moved

    def broadcast(self, tensors, opts):
        return super().broadcast(tensors, self._root(opts))

    def reduce(self, tensors, opts):
        return super().reduce(tensors, self._root(opts))

    def gather(self, output_lists, inputs, opts):
        return super().gather(output_lists, inputs, self._root(opts))

    def scatter(self, outputs, input_lists, opts):
        return super().scatter(outputs, input_lists, self._root(opts))


def _create(backend_opts, _options):
    return SubgroupGlobalRanks(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                               backend_opts.timeout, list(backend_opts.global_ranks_in_group))


def register():
    dist.Backend.register_backend(SubgroupGlobalRanks.NAME, _create, extended_api=True, devices=["cpu"])
    return SubgroupGlobalRanks.NAME
