"""The launcher environment an engine reads to find its world (``torchrun``'s variables), set from
the replica's context: the kit's world is already initialised, engines that look for a launcher
find one."""
from __future__ import annotations

import os


def export_launcher_env(ctx) -> None:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (one host) of replica ``ctx``,
    and a ``MASTER_ADDR``/``MASTER_PORT`` where none is set (unused: the group exists)."""
    os.environ.update(RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world_size), LOCAL_RANK=str(ctx.rank),
                      LOCAL_WORLD_SIZE=str(ctx.world_size), NODE_RANK="0", GROUP_RANK="0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
