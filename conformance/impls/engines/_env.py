"""The launcher environment an engine reads to find its world (``torchrun``'s variables), set from
the replica's context: the kit's world is already initialised, engines that look for a launcher
find one."""
from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def launcher_env(ctx, **defaults):
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (one host), ``NODE_RANK``,
    ``GROUP_RANK`` of replica ``ctx``, and a ``MASTER_ADDR``/``MASTER_PORT`` (unused: the group
    exists) and each of ``defaults`` (an engine's own switches, ``DS_ACCELERATOR="cpu"``) where
    none is set, while the engine is built; then the environment as it was (the engines read it
    at construction; a later implementation's environment is not this row's)."""
    defaults = dict({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, **defaults)
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", *defaults)
    before = {k: os.environ.get(k) for k in names}
    os.environ.update(RANK=str(ctx.rank), WORLD_SIZE=str(ctx.world_size), LOCAL_RANK=str(ctx.rank),
                      LOCAL_WORLD_SIZE=str(ctx.world_size), NODE_RANK="0", GROUP_RANK="0")
    for k, v in defaults.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
