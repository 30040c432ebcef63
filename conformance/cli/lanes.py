"""Lanes: the case runs of ``python -m conformance run`` evaluated side by side (why and what it
measured: docs/robustness.md, "Two lanes").

Each lane is a thread with its own :class:`~conformance.evaluate.Session` and world pool, so one
lane's replicas train while another lane's reference runs; lanes share the hosts' fork server
and the sessions' caches of finished runs. A lane keeps to one target world (runtime x world
size) while it has case runs left, then helps the lane with the most left (two lanes on one PJRT
size would compile the same graphs twice). A run's verdicts are kept in table order whatever
lane finished them first; ``-x`` and ``--exitfirst-each`` use one lane.
"""
from __future__ import annotations

import collections
import os
import sys
import threading

from conformance.evaluate import Session
from conformance.worlds.hoststart import stop_server

# Seconds between two checks of the lanes by the main thread (which alone receives SIGINT and
# SIGTERM: a join that never returns would defer them).
JOIN_POLL_S = 0.2
# Most seconds the main thread waits for each lane after halting them.
HALT_JOIN_S = 10.0


# Set by an interrupted run that used lanes (see end_process).
_END_WITHOUT_FINALIZING = threading.Event()


def skip_finalization() -> None:
    """Ask :func:`end_process` to end this process without the interpreter's finalization: torch
    threads that ran a lane's work (autograd, a lane still in a torch call) can abort it there
    ("terminate called without an active exception", pytorch/pytorch#38228; seen as exit -6
    instead of 130 in 1 of ~6 interrupted runs under load)."""
    _END_WITHOUT_FINALIZING.set()


def end_process(code: int) -> None:
    """After the command's cleanup (report written, worlds closed, lock released): stop the hosts'
    fork server and ``os._exit`` with ``code`` if :func:`skip_finalization` was asked, else return."""
    if _END_WITHOUT_FINALIZING.is_set():
        stop_server()  # it would see this process end anyway; its hosts, if any, die with it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Unit(collections.namedtuple("Unit", "index target impl case")):
    """One case run: its place in table order, the target ``(runtime, W, impls)``'s index,
    the implementation and the case."""


class Lanes:
    """``n`` lane threads evaluating :class:`Unit` s with ``work(session, unit)``.

    Args:
        sessions: one session per lane (the first is the run's own); ``len(sessions)`` lanes.
        work: called in a lane thread for each unit; its return value is passed to ``done``.
        done: called in the lane thread, under the lanes' lock, with ``(unit, result)``.

    A unit that a lane finishes after :meth:`halt` is dropped (an interrupt closed its world
    under it: its "replica died" verdicts would be the kit's, not the implementation's).
    """

    def __init__(self, sessions: list[Session], work, done):
        self.sessions, self.work, self.done = sessions, work, done
        self.lock = threading.Lock()
        self.halted = threading.Event()
        self.error: BaseException | None = None

    def run(self, units) -> None:
        """Evaluate ``units`` on every lane; return when all are done.

        Raises:
            KeyboardInterrupt: SIGINT / SIGTERM in the main thread (the lanes are halted, their
                worlds closed and their threads joined first).
            BaseException: what a lane raised outside a case's evaluation (a kit bug).
        """
        self.queues: dict = {}  # target -> its units left, in table order
        for u in units:
            self.queues.setdefault(u.target, collections.deque()).append(u)
        self.claimed: set = set()
        threads = [threading.Thread(target=self._lane, args=(s,), name=f"conformance-lane-{i}", daemon=True)
                   for i, s in enumerate(self.sessions)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(JOIN_POLL_S)
        except BaseException:
            self.halt()
            for t in threads:  # quick: halt() closed every world a lane could wait on, and a lane
                t.join(HALT_JOIN_S)  # asking for a new one gets PoolHalted (daemon threads: never a hang)
            raise
        if self.error is not None:
            raise self.error

    def halt(self) -> None:
        """Stop the lanes: no new unit starts, and every lane's worlds close (a lane waiting on
        its replicas returns at once)."""
        self.halted.set()
        for s in self.sessions:
            s.halt()

    def take(self, target):
        """The next unit of ``target`` (the lane's own), else of the first target no lane has
        taken, else of the target with the most units left; ``None`` when none is left."""
        with self.lock:
            if not self.queues.get(target):
                left = [t for t, q in self.queues.items() if q]
                if not left:
                    return None
                fresh = [t for t in left if t not in self.claimed]
                target = fresh[0] if fresh else max(left, key=lambda t: len(self.queues[t]))
                self.claimed.add(target)
            return self.queues[target].popleft()

    def _lane(self, session: Session) -> None:
        target = None
        try:
            while not self.halted.is_set():
                unit = self.take(target)
                if unit is None:
                    return
                target = unit.target
                result = self.work(session, unit)
                with self.lock:
                    if self.halted.is_set():
                        return
                    self.done(unit, result)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            with self.lock:
                if self.error is None:
                    self.error = exc
            self.halt()
