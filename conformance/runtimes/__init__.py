"""Runtime adapters: the only code that differs between runtimes.

Each adapter says where replicas live (host processes x replicas per host), how a
host initialises its runtime, and how a task runs on the host's replicas.
"""
from __future__ import annotations

import importlib

from .base import ReplicaContext, Runtime, RuntimeUnavailable

RUNTIMES = {"cpu": "conformance.runtimes.cpu:CpuRuntime",
            "pjrt": "conformance.runtimes.pjrt:PjrtRuntime",
            "xrt": "conformance.runtimes.xrt:XrtRuntime"}

# What a test run covers per runtime unless --world-size / --ddp say otherwise.
DEFAULTS = {
    "cpu": {"world_sizes": (2,), "impls": ("torch", "ref")},
    "pjrt": {"world_sizes": (2, 4), "slow_world_sizes": (8,), "impls": ("ref", "xla_recipe", "torch")},
    "xrt": {"world_sizes": (8,), "impls": ("ref",)},
}


def get_runtime(name: str) -> Runtime:
    """Return the adapter for runtime ``name``.

    Raises:
        KeyError: unknown runtime (message lists the known ones).
    """
    if name not in RUNTIMES:
        raise KeyError(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}")
    module, cls = RUNTIMES[name].split(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["DEFAULTS", "RUNTIMES", "ReplicaContext", "Runtime", "RuntimeUnavailable", "get_runtime"]
