"""The runtime registry and :class:`WorldKey`, a world's identity (the adapters themselves live
in :mod:`conformance.worlds.runtimes`; adding one: docs/extending.md "A new runtime").

A leaf module (it imports nothing of the kit): :mod:`conformance.settings` and the faces read a
runtime's facts (:data:`conformance.worlds.runtimes.base.Runtime.FACTS`) from the adapter class
registered here. The adapter modules import no torch at import, so reading a fact does not load it.
"""
from __future__ import annotations

import dataclasses
import importlib

#: runtime name -> ``"module:Class"`` of its adapter (selectable with ``--runtime``).
RUNTIMES = {"cpu": "conformance.worlds.runtimes.cpu:CpuRuntime",
            "pjrt": "conformance.worlds.runtimes.pjrt:PjrtRuntime",
            "xrt": "conformance.worlds.runtimes.xrt:XrtRuntime"}


def register(name: str, adapter: str | type) -> None:
    """Register runtime ``name``: its adapter class or its ``"module:Class"`` path."""
    RUNTIMES[name] = adapter


def unregister(name: str) -> None:
    RUNTIMES.pop(name, None)


def _load(path):
    if isinstance(path, type):
        return path
    module, cls = path.split(":")
    return getattr(importlib.import_module(module), cls)


def runtime_class(name: str) -> type:
    """The adapter class of runtime ``name`` (imported on first use; no torch at import).

    Raises:
        KeyError: unknown runtime (message lists the known ones).
    """
    if name not in RUNTIMES:
        raise KeyError(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}")
    return _load(RUNTIMES[name])


def topologies(runtime: str) -> dict:
    """Topologies of ``runtime`` (``{topology: "module:Class"}``; empty for an unknown runtime)."""
    return dict(runtime_class(runtime).topologies) if runtime in RUNTIMES else {}


def topology_class(runtime: str, topology: str) -> type:
    """The adapter class of ``runtime``'s ``topology`` world.

    Raises:
        KeyError: unknown topology (message lists the runtime's).
    """
    known = topologies(runtime)
    if topology not in known:
        raise KeyError(f"unknown topology {topology!r}; known: {', '.join(known)}")
    return _load(known[topology])


def adapter_named(name: str) -> type | None:
    """The adapter class whose ``name`` is ``name`` (a replica context's ``ctx.runtime``: a
    runtime, or a topology world such as ``pjrt_spmd``); ``None`` if none is registered."""
    if name in RUNTIMES:
        return runtime_class(name)
    for runtime in RUNTIMES:
        for topology in topologies(runtime):
            cls = topology_class(runtime, topology)
            if cls.name == name:
                return cls
    return None


@dataclasses.dataclass(frozen=True)
class WorldKey:
    """A world's identity: ``size`` devices of ``runtime`` in ``topology`` (``None``: the
    runtime's own, one replica per device). Hashable and frozen: the world pools key their
    worlds by it, and it travels to the host processes as itself.

    Its spellings, kept as they are in reports and verdicts: :attr:`world` (the world's runtime
    name: ``"pjrt"``, or ``"pjrt_spmd:4"`` for a topology world) and :attr:`where` (the key of
    a model's ``unsupported`` reasons: ``"pjrt"``, ``"pjrt:spmd"``).
    """

    runtime: str
    size: int
    topology: str | None = None

    @property
    def world(self) -> str:
        """The world's name, for display (a world's ``describe()``, reports); :meth:`parse` reads it back."""
        return self.runtime if self.topology is None else f"{self.runtime}_{self.topology}:{self.size}"

    @property
    def replicas(self) -> int:
        """Replica contexts the world hosts: ``size``, or 1 for a topology world (one program)."""
        return self.size if self.topology is None else 1

    @property
    def where(self) -> str:
        return self.runtime if self.topology is None else f"{self.runtime}:{self.topology}"

    @classmethod
    def of(cls, world: "WorldKey | str", size: int | None = None) -> "WorldKey":
        """``world`` itself when it is a key, else the key of its spelled name (:meth:`parse`), so
        that a person or a test may write ``"cpu", 2`` where the kit passes the key.

        Raises:
            KeyError: no registered runtime or topology has that name.
        """
        return world if isinstance(world, cls) else cls.parse(world, size)

    @classmethod
    def parse(cls, world: str, size: int | None = None) -> "WorldKey":
        """The key of a world name (:attr:`world`); ``size`` for a runtime's own world, whose
        name does not carry it (0 when not given: :func:`get_runtime` needs none).

        Raises:
            KeyError: no registered runtime or topology has that name.
        """
        if world in RUNTIMES:
            return cls(world, size if size is not None else 0)
        base, _, arg = world.partition(":")
        for runtime in RUNTIMES:
            topology = base[len(runtime) + 1:]
            if base.startswith(runtime + "_") and arg.isdigit() and topology in topologies(runtime):
                return cls(runtime, int(arg), topology)
        raise KeyError(f"unknown runtime {world!r}; known: {', '.join(RUNTIMES)}")
