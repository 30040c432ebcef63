"""Process-group initialisation and spawning with rank = process index.

``init_process_group`` mirrors the PJRT seed's choice: torch.distributed's rank
is the *process* index and its world size the *process* count (JAX semantics),
not the replica ordinal - on hosts that drive several replicas per process the
two differ (see :mod:`ddp_impl.runtime.ranks`).
"""
from __future__ import annotations

import datetime
import os
import tempfile

import torch.distributed as dist

from ddp_impl.runtime import ranks

DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: datetime.timedelta = DEFAULT_TIMEOUT, **kwargs) -> None:
    """Initialise torch.distributed with rank = process_index(), world = process_count().

    Args:
        backend: default ``"gloo"`` on the torch runtime, ``"xla"`` on PJRT.
        init_method: default ``"env://"`` (``MASTER_ADDR``/``MASTER_PORT``, as
            torchrun sets them) on the torch runtime, ``"xla://"`` on PJRT.
        timeout: bound on every collective of the group (default 120 s).
        **kwargs: passed to ``torch.distributed.init_process_group``.

    Raises:
        RuntimeError: if torch.distributed is already initialised, or the
            rendezvous fails within ``timeout``.
    """
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised")
    if ranks.current_runtime() == "pjrt":
        from ddp_impl.runtime.xla import init_pjrt_process_group
        init_pjrt_process_group(timeout=timeout, **kwargs)
        return
    b = ranks.torch_bindings()
    dist.init_process_group(backend or "gloo", init_method=init_method or "env://",
                            rank=b.process_index, world_size=b.process_count,
                            timeout=timeout, **kwargs)


def _spawned(index, fn, args, nprocs, init_file, init_torch_distributed):
    os.environ.update(RANK=str(index), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(index),
                      LOCAL_WORLD_SIZE=str(nprocs))
    if init_torch_distributed:
        init_process_group("gloo", init_method=f"file://{init_file}")
    try:
        fn(index, *args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, args=(), nprocs: int = 2, init_torch_distributed: bool = False,
          join: bool = True):
    """Run ``fn(index, *args)`` in ``nprocs`` fresh processes of this host.

    Each process sees ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` so the rank bindings
    work without torch.distributed. With ``init_torch_distributed=True`` a gloo
    group is initialised (file rendezvous: no ports) before ``fn`` runs. Default
    off, as the PJRT seed: TCP initialisation is flaky on large pods and most
    code needs only the bindings. On PJRT use :func:`ddp_impl.runtime.xla.spawn`.

    Raises:
        torch.multiprocessing.ProcessRaisedException: when a process raises.
    """
    import torch.multiprocessing as mp
    fd, init_file = tempfile.mkstemp(prefix="ddp-spawn-")
    os.close(fd)
    os.unlink(init_file)  # FileStore wants to create it
    try:
        return mp.start_processes(
            _spawned, args=(fn, args, nprocs, init_file, init_torch_distributed),
            nprocs=nprocs, join=join, start_method="spawn")
    finally:
        if join and os.path.exists(init_file):
            os.unlink(init_file)
