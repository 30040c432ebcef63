"""Reference data-parallel implementation and rank bindings (see README)."""
from ddp_impl.runtime.collectives import Collectives, TorchDistributedCollectives, default_collectives
from ddp_impl.ddp import DistributedDataParallel
from ddp_impl.runtime.launch import init_process_group, spawn
from ddp_impl.runtime.ranks import RankBindings, current_runtime, global_ordinal, local_device_count, local_ordinal, process_count, process_index, world_size

__all__ = [
    "Collectives", "TorchDistributedCollectives", "default_collectives",
    "DistributedDataParallel", "init_process_group", "spawn", "RankBindings",
    "current_runtime", "global_ordinal", "local_device_count", "local_ordinal",
    "process_count", "process_index", "world_size",
]
