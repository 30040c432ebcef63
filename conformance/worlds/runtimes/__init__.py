"""Runtime adapters: the only code that differs between runtimes.

Each adapter says where replicas live (host processes x replicas per host), how a
host initialises its runtime, and how a task runs on the host's replicas.
"""
from __future__ import annotations

import importlib

from conformance.worlds.runtimes.base import ReplicaContext, Runtime, RuntimeUnavailable

RUNTIMES = {"cpu": "conformance.worlds.runtimes.cpu:CpuRuntime",
            "pjrt": "conformance.worlds.runtimes.pjrt:PjrtRuntime",
            "xrt": "conformance.worlds.runtimes.xrt:XrtRuntime"}

# Topologies an implementation row maps a runtime to (``Strategy.topology``); not
# selectable with --runtime. ``world_for`` names their worlds.
TOPOLOGIES = {"spmd": "conformance.worlds.runtimes.pjrt_spmd:PjrtSpmdRuntime"}


def world_for(runtime: str, topology: str | None, world_size: int) -> tuple[str, int]:
    """``(world runtime name, replica count)`` hosting ``world_size`` devices of
    ``runtime`` in ``topology`` (``None``: the runtime's own, one replica per device).
    ``spmd``: one program over a ``world_size``-device mesh, ``("pjrt_spmd:W", 1)``."""
    if topology is None:
        return runtime, world_size
    if topology not in TOPOLOGIES:
        raise KeyError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
    return f"pjrt_{topology}:{world_size}", 1


def get_runtime(name: str, settings=None) -> Runtime:
    """Return the adapter for runtime ``name`` (or a topology world, ``pjrt_spmd:W``),
    configured by ``settings`` (:class:`conformance.settings.Settings`; default: built-in).

    Raises:
        KeyError: unknown runtime (message lists the known ones).
    """
    base, _, arg = name.partition(":")
    if base.startswith("pjrt_") and base[len("pjrt_"):] in TOPOLOGIES and arg.isdigit():
        module, cls = TOPOLOGIES[base[len("pjrt_"):]].split(":")
        return _configured(getattr(importlib.import_module(module), cls)(int(arg)), settings)
    if name not in RUNTIMES:
        raise KeyError(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}")
    module, cls = RUNTIMES[name].split(":")
    return _configured(getattr(importlib.import_module(module), cls)(), settings)


def _configured(adapter: Runtime, settings) -> Runtime:
    if settings is not None:
        adapter.settings = settings
    return adapter


__all__ = ["RUNTIMES", "TOPOLOGIES", "ReplicaContext", "Runtime", "RuntimeUnavailable",
           "get_runtime", "world_for"]
