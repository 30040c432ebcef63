"""conformance.cli.lanes: units in lanes, an error or an interrupt halts every lane."""
import threading
import time

import pytest

from conformance.cli.lanes import Lanes, Unit


class FakeSession:
    def __init__(self):
        self.halted = threading.Event()

    def halt(self):
        self.halted.set()


def _units(n):
    return [Unit(i, 0, "impl", f"case{i}") for i in range(n)]


def test_every_unit_runs_once_across_the_lanes():
    sessions = [FakeSession(), FakeSession()]
    ran, lanes_used = [], set()

    def work(session, unit):
        lanes_used.add(id(session))
        time.sleep(0.01)
        return unit.index * 10

    Lanes(sessions, work, lambda unit, result: ran.append((unit.index, result))).run(_units(12))
    assert sorted(ran) == [(i, i * 10) for i in range(12)]
    assert len(lanes_used) == 2  # both lanes took units


def test_an_error_outside_a_case_halts_every_lane_and_reaches_the_caller():
    sessions = [FakeSession(), FakeSession()]
    done = []

    def work(session, unit):
        if unit.index == 3:
            raise ValueError("kit bug")
        if session.halted.wait(5):  # the other lane: its world is closed under it
            return "after halt"
        return "ok"

    with pytest.raises(ValueError, match="kit bug"):
        Lanes(sessions, work, lambda unit, result: done.append(result)).run(_units(8))
    assert all(s.halted.is_set() for s in sessions)
    assert "after halt" not in done  # a unit finished after the halt is dropped


def test_an_interrupt_in_the_main_thread_halts_the_lanes(monkeypatch):
    sessions = [FakeSession(), FakeSession()]
    started = threading.Barrier(3)

    reached = []

    def work(session, unit):
        started.wait(30)
        reached.append(session.halted.wait(30))  # True: the halt reached this lane's wait
        return unit.index

    lanes = Lanes(sessions, work, lambda unit, result: pytest.fail("a halted lane recorded a unit"))
    original_join = threading.Thread.join

    def join(self, timeout=None):  # the signal arrives while the main thread waits on a lane
        if self.name.startswith("conformance-lane-") and timeout is not None and not lanes.halted.is_set():
            started.wait(30)
            raise KeyboardInterrupt
        return original_join(self, timeout)

    monkeypatch.setattr(threading.Thread, "join", join)
    with pytest.raises(KeyboardInterrupt):
        lanes.run(_units(4))
    assert all(s.halted.is_set() for s in sessions)
    assert reached == [True, True]  # both lanes' waits ended by the halt, and no new unit started
