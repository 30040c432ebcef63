"""Rank bindings with JAX semantics, for every runtime the kit knows.

Vocabulary (as in ``jax.process_index`` / ``jax.process_count``):

* **process index / count** - which host *process* this is, and how many take part.
* **global ordinal** - the replica's index in the whole world (what
  ``torch.distributed`` calls rank when one process drives one replica).
* **local ordinal** - the replica's index among the replicas of its host
  machine (torchrun's ``LOCAL_RANK``, torch_xla's ``local_ordinal``).
* **world size** - number of replicas = ``process_count * local_device_count``
  when every process drives the same number of replicas.
* **local device count** - replicas driven by this process.

On the CPU runtime (torch.distributed, one replica per process) process index ==
global ordinal. On a TPU v2/v3-shaped PJRT host one process drives several
replicas (one thread each), so process index != global ordinal: code that shards
data must use :func:`global_ordinal`, and code that talks to torch.distributed
uses :func:`process_index`.

Every function reads the runtime of the calling replica (see
:func:`current_runtime`) and returns an ``int``.
"""
from __future__ import annotations

import os
import sys
import threading
from ddp_impl.runtime.types import RankBindings  # noqa: F401  (re-exported)

RUNTIMES = ("torch", "pjrt", "xrt")

_XRT_VARS = ("XRT_TPU_CONFIG", "XRT_WORKERS", "XRT_SHARD_WORLD_SIZE", "XRT_DEVICE_MAP")


_thread = threading.local()


def bind_thread(bindings: RankBindings | None) -> None:
    """Pin ``bindings`` for the calling thread (``None`` unpins).

    Used by runtimes that run several replicas as threads of one process, where
    the process-wide environment cannot tell the replicas apart.
    """
    _thread.bindings = bindings


def current_runtime(environ=None) -> str:
    """Name the runtime the caller runs on: ``"pjrt"``, ``"xrt"`` or ``"torch"``.

    ``pjrt`` when torch_xla is imported and ``PJRT_DEVICE`` is set; ``xrt`` when
    one of the XRT configuration variables is set; otherwise ``torch``
    (torch.distributed, or a single process when it is not initialised).
    """
    env = os.environ if environ is None else environ
    if env.get("PJRT_DEVICE") and "torch_xla" in sys.modules:
        return "pjrt"
    if any(env.get(v) for v in _XRT_VARS):
        return "xrt"
    return "torch"


def torch_bindings(environ=None) -> RankBindings:
    """Bindings of a torch.distributed process driving one replica.

    Rank and world size come from the initialised default process group, else
    from the launcher's ``RANK``/``WORLD_SIZE`` (torchrun, env://), else a single
    process. The local ordinal is ``LOCAL_RANK`` (torchrun) when set.

    Raises:
        ValueError: when the environment is inconsistent (rank outside the world).
    """
    import torch.distributed as dist
    env = os.environ if environ is None else environ
    if dist.is_available() and dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
    else:
        rank, size = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    local = int(env.get("LOCAL_RANK", rank))
    if not 0 <= rank < size or local < 0:
        raise ValueError(f"inconsistent ranks: RANK={rank} WORLD_SIZE={size} LOCAL_RANK={local}")
    return RankBindings(process_index=rank, process_count=size, global_ordinal=rank,
                        local_ordinal=local, world_size=size, local_device_count=1)


def bindings() -> RankBindings:
    """The calling replica's :class:`RankBindings` on its current runtime."""
    pinned = getattr(_thread, "bindings", None)
    if pinned is not None:
        return pinned
    runtime = current_runtime()
    if runtime == "pjrt":
        from ddp_impl.runtime.xla import pjrt_bindings
        return pjrt_bindings()
    if runtime == "xrt":
        from ddp_impl.runtime.xrt import xrt_bindings
        return xrt_bindings(os.environ)
    return torch_bindings()


def process_index() -> int:
    """Index of this host process, ``0 <= i < process_count()`` (``jax.process_index``)."""
    return bindings().process_index


def process_count() -> int:
    """Number of host processes (``jax.process_count``)."""
    return bindings().process_count


def global_ordinal() -> int:
    """This replica's index in the world, ``0 <= o < world_size()``."""
    return bindings().global_ordinal


def local_ordinal() -> int:
    """This replica's index among the replicas of its host machine."""
    return bindings().local_ordinal


def world_size() -> int:
    """Number of replicas in the world."""
    return bindings().world_size


def local_device_count() -> int:
    """Number of replicas (devices) this process drives."""
    return bindings().local_device_count
