"""The world pool: what a :class:`conformance.evaluate.Session` asks of the worlds it runs on.

Declared once, as pytest-xdist declares its scheduler's interface: :class:`Pool` names every
member a caller may use and gives the defaults of a pool that has nothing to say about one.
Every pool derives from it - :class:`WorldPool` (the worlds the kit spawns),
:class:`conformance.worlds.launched.ExternalPool` (the one world an env:// launcher started), the
test doubles - and callers use its members plainly, never probing for them.
"""
from __future__ import annotations

import abc
import threading
from typing import Sequence

from conformance.settings import Settings
from conformance.worlds.failure import HostDiedStarting
from conformance.worlds.registry import WorldKey
from conformance.worlds.spawned import World


class PoolHalted(BaseException):
    """A world was asked of a halted pool (:meth:`Pool.halt`: the run was interrupted). Not an
    ``Exception``, like ``KeyboardInterrupt``: a Hypothesis search or an evaluator's
    ``except Exception`` lets it through, so the thread asking stops at once."""


class Pool(abc.ABC):
    """The worlds of a run, by :class:`~conformance.worlds.registry.WorldKey`.

    A world is an object with ``run(fn, timeout=None, **payload) -> list | None`` (``fn(ctx,
    **payload)`` on every replica: the results by rank, ``None`` on a process that does not receive
    them), ``world_size``, ``broken``, ``describe() -> str``, ``pids() -> list[int]`` and
    ``close()``: a :class:`conformance.worlds.spawned.World` or a :class:`conformance.worlds.launched.ExternalWorld`.

    Attributes:
        sees_every_result: ``True`` when a task's results come back to the process that runs it;
            ``False`` when they reach the root process only (a launcher-built world: the searching
            kinds, which draw each example from the last result, are skipped there).
        is_root: ``True`` on the process that evaluates and reports (the one process of a spawning
            pool; rank 0 of a launcher-built world).
        restarts: one line per world start that a host's crash undid and the pool made again
            (reported as a warning by every face); empty when none was.
    """

    sees_every_result: bool = True
    is_root: bool = True
    restarts: Sequence[str] = ()

    @abc.abstractmethod
    def get(self, world: WorldKey):
        """The started world ``world`` names, made on first use (or again, when broken).

        Raises:
            ReplicaError: its hosts could not start (:mod:`conformance.worlds.failure`), or the
                pool cannot replace a broken world.
            RuntimeUnavailable: the world cannot run here (one line).
            KeyError: an unknown runtime or topology.
            PoolHalted: the pool was halted (:meth:`halt`).
        """

    def prestart(self, world: WorldKey):
        """Start ``world`` now without waiting for it, so that its hosts start while this process
        works with another world; :meth:`get` then returns it. Returns the world, or ``None`` when
        nothing is started ahead (the default) or it cannot be (:meth:`get` raises the error where
        it is reported). Raises nothing."""
        return None

    def broadcast(self, obj, src: int = 0):
        """Process ``src``'s ``obj`` on every process of the pool (the default, one process:
        ``obj``), so that every process of a launcher-built world exits alike."""
        return obj

    def halt(self) -> None:
        """Close every world and start no new one: a thread that asks for a world after this gets
        :class:`PoolHalted` where the pool can tell (the default: :meth:`close` only)."""
        self.close()

    @abc.abstractmethod
    def close(self) -> None:
        """Close every world of the pool (idempotent)."""


def _not_started(world: WorldKey) -> PoolHalted:
    return PoolHalted(f"{world.world} world of {world.replicas} replica(s) not started: the run was interrupted")


#: Starts of one world :meth:`WorldPool.get` makes when a host crashes (a fatal signal) while
#: starting, before any task: a rare crash of a runtime's start-up is not charged to the DDP's
#: verdicts (docs/robustness.md "A crash while starting"). A crash at every attempt is a
#: runtime that cannot start, and is reported as such.
START_ATTEMPTS = 2


class WorldPool(Pool):
    """Spawned worlds (:class:`conformance.worlds.spawned.World`) by key, started on first use,
    replaced when broken.

    Args:
        settings: the run's :class:`~conformance.settings.Settings` (default: built-in defaults).
        restarts: the list :attr:`restarts` appends to (default: a new one), e.g. a pytest
            session's, which its summary reports.
    """

    def __init__(self, settings: Settings | None = None, restarts: list[str] | None = None):
        self.settings = settings or Settings()
        self._worlds: dict[WorldKey, World] = {}
        self._halted = False
        self._lock = threading.Lock()
        self.restarts: list[str] = [] if restarts is None else restarts

    def get(self, world: WorldKey) -> World:
        """:meth:`Pool.get`. A start-up that a host's crash (a fatal signal before any task) undid
        is made again, up to :data:`START_ATTEMPTS` starts in all, and said in :attr:`restarts`; a
        crash at every attempt raises the last one's :class:`~conformance.worlds.failure.HostDiedStarting`."""
        with self._lock:  # another thread may halt the pool meanwhile
            if self._halted:
                raise _not_started(world)
            started = self._worlds.get(world)
        for attempt in range(1, START_ATTEMPTS + 1):
            if started is None or started.broken:
                # started outside the lock: a start can wait seconds on the fork server's imports
                started = self._keep(world, World(world, settings=self.settings, wait=False))
            try:
                started.wait_started()
                return started
            except HostDiedStarting as err:
                with self._lock:
                    if self._halted:  # the hosts were killed by the halt, not by a crash
                        raise _not_started(world) from None
                if not err.by_signal or attempt == START_ATTEMPTS:
                    raise
                self.restarts.append(f"{started.describe()}: {err.death} while starting"
                                     f"{f' at {err.where}' if err.where else ''} "
                                     f"(start {attempt} of {START_ATTEMPTS}); started again")

    def _keep(self, key: WorldKey, world: World) -> World:
        """``world``, now the pool's for ``key``; closed at once, raising :class:`PoolHalted`, if the
        pool was halted while it started."""
        with self._lock:
            if not self._halted:
                self._worlds[key] = world
                return world
        world.close()
        raise _not_started(key)

    def prestart(self, world: WorldKey) -> World | None:
        """:meth:`Pool.prestart`: the hosts import the runtime while this process still works with
        another world (docs/runtimes/pjrt.md "The next world starts meanwhile")."""
        with self._lock:
            if self._halted:
                return None
            if world in self._worlds and not self._worlds[world].broken:
                return self._worlds[world]
        try:
            return self._keep(world, World(world, settings=self.settings, wait=False))
        except (Exception, PoolHalted):  # unavailable runtime, bad size, spawn failure: get() reports it
            return None

    def halt(self) -> None:
        """:meth:`Pool.halt`: a thread of an interrupted run gets :class:`PoolHalted`, not a world nobody closes."""
        with self._lock:
            self._halted = True
        self.close()

    def close(self) -> None:
        with self._lock:
            worlds = list(self._worlds.values())
            self._worlds.clear()
        for world in worlds:  # every host tears down at once, then each is reaped
            world.request_stop()
        for world in worlds:
            world.close()  # removes its work directory too
