"""Reference data-parallel implementation and rank bindings (see README).

The reference DDP (:class:`DistributedDataParallel`, an implementation under test) is
``ddp_impl.ddp``; the runtime plumbing the kit's worlds also use - rank bindings,
collectives, launch, torch_xla and XRT support - is ``ddp_impl.runtime``. The modules
``ranks``, ``collectives``, ``launch`` and ``xla`` are also attributes of this package
(``from ddp_impl import ranks``).
"""
from ddp_impl.ddp import DistributedDataParallel
from ddp_impl.runtime import collectives, launch, ranks, xla
from ddp_impl.runtime.collectives import Collectives, TorchDistributedCollectives, default_collectives
from ddp_impl.runtime.launch import init_process_group, spawn
from ddp_impl.runtime.ranks import (RankBindings, current_runtime, global_ordinal, local_device_count, local_ordinal,
                                    process_count, process_index, world_size)

__all__ = [
    "Collectives", "TorchDistributedCollectives", "default_collectives",
    "DistributedDataParallel", "init_process_group", "spawn", "RankBindings",
    "current_runtime", "global_ordinal", "local_device_count", "local_ordinal",
    "process_count", "process_index", "world_size", "collectives", "launch", "ranks", "xla",
]
