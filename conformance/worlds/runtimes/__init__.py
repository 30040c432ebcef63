"""Runtime adapters: the only code that differs between runtimes.

Each adapter says where replicas live (host processes x replicas per host), how a host
initialises its runtime and how a task runs on the host's replicas; its class attributes are the
runtime's facts (:class:`~conformance.worlds.runtimes.base.Runtime`). The registry
(:mod:`conformance.worlds.registry`) names them; a world is identified by a
:class:`~conformance.worlds.registry.WorldKey`.
"""
from __future__ import annotations

from conformance.worlds.runtimes.base import ReplicaContext, Runtime, RuntimeUnavailable
from conformance.worlds.registry import (RUNTIMES, WorldKey, register, runtime_class, topologies,
                                                  topology_class, unregister)


def world_key(runtime: str, topology: str | None, world_size: int) -> WorldKey:
    """The world hosting ``world_size`` devices of ``runtime`` in ``topology`` (``None``: the
    runtime's own, one replica per device; ``spmd``: one program over a ``world_size``-device
    mesh, the world ``pjrt_spmd:W`` of one replica context).

    Raises:
        KeyError: a topology ``runtime`` does not have (message lists its topologies).
    """
    if topology is not None:
        topology_class(runtime, topology)
    return WorldKey(runtime, world_size, topology)


def get_runtime(name: str | WorldKey, settings=None) -> Runtime:
    """Return the adapter for a world: a :class:`WorldKey`, a runtime name, or a topology
    world's name (:attr:`WorldKey.world`, ``pjrt_spmd:W``), configured by ``settings``
    (:class:`conformance.settings.Settings`; default: built-in).

    Raises:
        KeyError: unknown runtime (message lists the known ones).
    """
    key = WorldKey.of(name)
    if key.topology is None:
        adapter = runtime_class(key.runtime)()
    else:
        adapter = topology_class(key.runtime, key.topology)(key.size)
    if settings is not None:
        adapter.settings = settings
    return adapter


def check_world(world: WorldKey, settings=None) -> Runtime:
    """The adapter of ``world`` (configured by ``settings``) once its
    :meth:`~conformance.worlds.runtimes.base.Runtime.check` of the world's replicas passed: the one
    check of a runtime and world size that the faces, :func:`conformance.evaluate.evaluate` and the worlds make.

    Raises:
        KeyError: unknown runtime or topology (message lists the known ones).
        RuntimeUnavailable: the world cannot run here (one line: the size is out of the runtime's
            range, or its library or device is missing).
    """
    adapter = get_runtime(world, settings)
    adapter.check(world.replicas)
    return adapter


__all__ = ["RUNTIMES", "ReplicaContext", "Runtime", "RuntimeUnavailable", "WorldKey", "check_world", "get_runtime",
           "register", "runtime_class", "topologies", "topology_class", "unregister", "world_key"]
