"""The persistent world never hangs and never leaves orphans: failures are
bounded, named, and carry the replica's traceback, stacks or log."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conformance.settings import Settings
from conformance.worlds.failure import HostDiedStarting, ReplicaDied, ReplicaFailed, ReplicaTimeout
from conformance.worlds.pool import Pool, WorldPool
from conformance.worlds.registry import WorldKey
from conformance.worlds.spawned import World
from tests.procs import QUIET_START_S, REPO, alive, default_signals, gone, load_scale, start_world
from tests import tasks
from tests.tasks import all_reduce_value, env_and_parent, fail_on, raise_while_peer_waits

pytestmark = pytest.mark.cpu


@pytest.fixture
def fresh_world():
    """A CPU world of 2; ``.load_scale``: how much slower than quiet its start-up was
    (:func:`tests.procs.load_scale`): the bounds below, written for a quiet machine, are
    multiplied by it."""
    w, w.load_scale = start_world("cpu", 2, timeout=30)
    yield w
    w.close()
    assert gone(w.pids())


def test_results_by_ordinal(fresh_world):
    assert fresh_world.run(all_reduce_value, values=[[1.0, 2.0], [10.0, 20.0]]) == [[11.0, 22.0]] * 2


def test_replica_exception_reports_traceback(fresh_world):
    with pytest.raises(ReplicaFailed, match="(?s)replica 1 raised.*ValueError: boom from replica 1"):
        fresh_world.run(fail_on, rank=1, how="raise")
    assert not fresh_world.broken and fresh_world.resets == 1  # every replica returned: kept


def test_world_survives_a_raise_and_names_the_culprit_each_time(fresh_world):
    """A raise while the peer waits in a torch.distributed collective of its own keeps the
    world (issue 26 item 1): the same host processes run the next task in a new process group,
    and each later raise is reported as the first was, with the stacks of that failure only."""
    pids = fresh_world.pids()
    for n, collective in enumerate(["all_reduce", "broadcast"], 1):
        with pytest.raises(ReplicaFailed) as err:
            fresh_world.run(raise_while_peer_waits, rank=1, collective=collective)
        d = err.value.diagnosis
        assert err.value.summary().startswith("replica 1 raised ValueError: boom from replica 1"), err.value.summary()
        assert [x["rank"] for x in d if x["culprit"]] == [1]
        assert (d[1]["status"], d[1]["step"], d[1]["phase"]) == ("raised", 1, "forward")
        assert "raise ValueError" in d[1]["traceback"]
        assert d[0]["status"] == "aborted-by-peer" and collective in (d[0]["in_collective"] or ""), d[0]
        assert f"in {collective}" in d[0]["stacks"]
        other = "broadcast" if collective == "all_reduce" else "all_reduce"
        assert f"in {other}\n" not in d[0]["stacks"] + "\n", "stacks of an earlier failure"
        assert not fresh_world.broken and fresh_world.resets == n and fresh_world.pids() == pids
        assert all(alive(p) for p in pids)
        assert fresh_world.run(all_reduce_value, values=[[1.0], [2.0]]) == [[3.0], [3.0]]


def test_stuck_replica_times_out_with_stack(fresh_world):
    scale = fresh_world.load_scale
    t0 = time.monotonic()
    with pytest.raises(ReplicaTimeout) as err:
        fresh_world.run(fail_on, timeout=3 * scale, rank=0, how="sleep", seconds=60 * scale)
    elapsed = time.monotonic() - t0
    assert elapsed < 15 * scale, f"reported after {elapsed:.1f} s (load x{scale:.1f})"
    assert "fail_on" in str(err.value) and "replica 0 Python stacks" in str(err.value)
    assert "replica 0 hung" in err.value.summary()
    assert re.search(r"machine load [\d.]+ \(1 min average\) on \d+ CPUs", str(err.value)), str(err.value)
    assert gone(fresh_world.pids())


def test_every_replica_stuck_names_them_all(fresh_world):
    """No replica stands out (all asleep outside any collective): the first sentence, which the
    table prints, names every culprit, not replica 0 alone."""
    scale = fresh_world.load_scale
    with pytest.raises(ReplicaTimeout) as err:
        fresh_world.run(fail_on, timeout=3 * scale, rank=None, how="sleep", seconds=60 * scale)
    summary = err.value.summary()
    assert [d["rank"] for d in err.value.diagnosis if d["culprit"]] == [0, 1], summary
    assert summary.startswith("no single culprit, replicas 0, 1 alike: replica 0 hung at "), summary


def test_replica_stuck_in_collective_times_out(fresh_world):
    with pytest.raises(ReplicaTimeout, match="(?s)all_reduce"):
        fresh_world.run(fail_on, timeout=3 * fresh_world.load_scale, rank=1, how="hang_collective")


def test_dead_replica_reported_with_exit_code(fresh_world):
    with pytest.raises(ReplicaDied, match="exited with code 3"):
        fresh_world.run(fail_on, rank=1, how="exit")


def test_pool_replaces_broken_world(world_pool):
    w = world_pool.get(WorldKey("cpu", 2))
    with pytest.raises(ReplicaDied):
        w.run(fail_on, rank=0, how="exit")
    w2 = world_pool.get(WorldKey("cpu", 2))
    assert w2 is not w and w2.run(all_reduce_value, values=[[1.0], [2.0]]) == [[3.0], [3.0]]


def test_prestarted_world_is_the_one_get_returns():
    """A world spawned ahead (WorldPool.prestart) is waited for and used by get(), not started twice."""
    pool = WorldPool()
    try:
        ahead = pool.prestart(WorldKey("cpu", 2))
        assert ahead is not None and not ahead.started and len(ahead.pids()) == 2
        assert pool.prestart(WorldKey("cpu", 2)) is ahead  # asked again while starting: the same hosts
        w = pool.get(WorldKey("cpu", 2))
        assert w is ahead and w.started
        assert w.run(all_reduce_value, values=[[1.0], [2.0]]) == [[3.0], [3.0]]
    finally:
        pool.close()
    assert gone(ahead.pids())


def test_prestart_error_is_reported_by_get():
    """A world that cannot start is not an error when spawned ahead; get() raises it."""
    pool = WorldPool()
    try:
        assert pool.prestart(WorldKey("nosuch", 2)) is None
        with pytest.raises(KeyError, match="unknown runtime 'nosuch'"):
            pool.get(WorldKey("nosuch", 2))
    finally:
        pool.close()


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_host_sees_the_environment_the_kit_had_when_it_started(monkeypatch, start):
    """A host forked by the fork server would otherwise inherit the server's environment, taken
    when the first world started; a spawned host (``Settings.host_start="spawn"``) is this
    process's own child."""
    settings = Settings(host_start=start)
    World("cpu", 2, settings=settings).close()  # the fork server (if any) starts with the environment of now
    monkeypatch.setenv("CONFORMANCE_TEST_MARK", f"set after the first world {time.monotonic()}")
    w = World("cpu", 2, settings=settings)
    try:
        got = w.run(env_and_parent, name="CONFORMANCE_TEST_MARK")
    finally:
        w.close()
    assert [v for v, _ in got] == [os.environ["CONFORMANCE_TEST_MARK"]] * 2
    parents = {p for _, p in got}
    assert (parents == {os.getpid()}) == (start == "spawn"), parents


def test_world_closed_while_starting_leaves_nothing():
    """Closing a world whose hosts are still importing (a run interrupted right after a
    prestart) kills them: they read no stop message yet."""
    w = World("cpu", 2, wait=False)
    pids = w.pids()
    assert all(alive(p) for p in pids) and not w.started
    w.close()
    assert gone(pids) and not os.path.exists(w.workdir)


@pytest.fixture
def registered(request):
    """Register the runtime ``request.param`` (a ``tests.tasks`` class) under its name; after
    the fork server started, as a plugin's runtime is."""
    from conformance.worlds.registry import register, unregister
    cls = getattr(tasks, request.param)
    register(cls.name, f"tests.tasks:{request.param}")
    yield cls.name
    unregister(cls.name)


@pytest.mark.parametrize("registered", ["CrashingAtStart"], indirect=True)
def test_a_host_that_dies_while_starting_shows_its_log_and_stacks(registered):
    """A fatal signal in a runtime's start-up (a segfault while XLA initialises) is reported
    with the host's exit signal, its log and its ``faulthandler`` dump, which name the function
    it died in; nothing of the world is left."""
    World("cpu", 2).close()  # the fork server runs already, as in a run
    with pytest.raises(ReplicaDied) as err:
        World(registered, 2)
    text = str(err.value)
    assert re.search(r"host \d \(pid \d+\) exited with code -11 \(SIGSEGV\) while starting", text), text
    assert re.search(r"start-up entered by host \d", text), text
    assert "stacks (faulthandler)" in text and "Segmentation fault" in text, text
    assert re.search(r'tasks\.py", line \d+ in setup_host', text), text


@pytest.mark.parametrize("registered", ["HangingAtStart"], indirect=True)
def test_a_host_that_does_not_finish_starting_shows_where_it_waits(registered):
    """A start-up past its bound is reported with each host's log and a stack dump taken
    before the kill, showing the line it waits on; its hosts are gone."""
    w = World(registered, 2, wait=False)
    deadline = time.monotonic() + 120  # the event bound: both hosts are inside their start-up
    while not all(os.path.exists(os.path.join(w.workdir, f"entered{h}")) for h in (0, 1)):
        assert time.monotonic() < deadline, "hosts never entered their start-up"
        time.sleep(0.05)
    pids = w.pids()
    w.settings = w.settings.replace(start_timeout=0.5)
    with pytest.raises(ReplicaTimeout) as err:
        w.wait_started()
    text = str(err.value)
    assert "host(s) [0, 1] did not start within" in text, text
    for h in (0, 1):
        assert f"start-up entered by host {h}" in text, text
        assert f"--- host {h} stacks (faulthandler):" in text, text
    assert re.search(r'tasks\.py", line \d+ in setup_host', text), text
    assert gone(pids) and not os.path.exists(w.workdir)


# runtime (tests.tasks) -> (world from get(), WorldPool.restarts lines, their text)
START_CRASHES = {
    "CrashingOnce": (True, 1, r"^crash_once world of 2 replica\(s\): host 0 \(pid \d+\) exited with code -11 \(SIGSEGV\) "
                              r"while starting at tests/tasks\.py:\d+ in setup_host: .* \(start 1 of 2\); started again"),
    "CrashingAtStart": (False, 1, r"exited with code -11 \(SIGSEGV\) while starting .*\(start 1 of 2\)"),
    "ExitingAtStart": (False, 0, None),  # its own exit: not a crash, not started again
}


@pytest.mark.parametrize("registered", list(START_CRASHES), indirect=True)
def test_the_pool_starts_again_a_world_a_crash_undid_and_says_so(registered, tmp_path, monkeypatch, request):
    """A host that dies of a fatal signal while starting (no task ran) costs one more start,
    said in ``WorldPool.restarts``; a second crash, or an exit of the host's own, is raised."""
    monkeypatch.setenv("CONFORMANCE_TEST_CRASHED", str(tmp_path / "crashed"))
    works, lines, text = START_CRASHES[request.node.callspec.params["registered"]]
    pool = WorldPool()
    try:
        if works:
            world = pool.get(WorldKey(registered, 2))
            assert world.run(all_reduce_value, values=[[1.0], [2.0]]) == [[3.0]] * 2
        else:
            with pytest.raises(HostDiedStarting):
                pool.get(WorldKey(registered, 2))
        assert len(pool.restarts) == lines, pool.restarts
        if text:
            assert re.search(text, pool.restarts[0]), pool.restarts
    finally:
        pool.close()


QUIET_PARENT_START_S = 1.8   # SCRIPT until it prints its pids, quiet 2-core machine (s): ~1.2 x a world start
SCRIPT = textwrap.dedent("""
    import sys, time
    from conformance.worlds.spawned import World
    from tests.tasks import fail_on
    if __name__ == "__main__":
        w = World("cpu", 2)
        print(" ".join(map(str, w.pids())), flush=True)
        w.run(fail_on, rank=0, how="sleep", seconds=600)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_no_orphans_when_parent_interrupted_or_killed(tmp_path, sig):
    script = tmp_path / "parent.py"
    script.write_text(SCRIPT)
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH")))))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, preexec_fn=default_signals,
                            env=env)  # the script imports tests.tasks: the repository on its path
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        # the child's start-up (interpreter, imports, its world) against a quiet world start
        scale = load_scale((time.monotonic() - t0) * QUIET_START_S / QUIET_PARENT_START_S)
        assert len(pids) == 2 and all(alive(p) for p in pids)
        time.sleep(1.0 * scale)
        proc.send_signal(sig)
        proc.wait(timeout=30 * scale)
        assert gone(pids, within=15 * scale), "replica processes outlived their parent"
    finally:
        proc.kill()
        proc.wait()


class _Progress:
    """The slice of a replica's progress board the collective watch reads and writes."""

    def __init__(self, tid):
        self.state = {"state": "running", "tid": tid}

    def seen_in(self, where):
        self.state["seen"] = where


def test_collective_watch_keeps_no_locals_alive(monkeypatch):
    """The host's collective watch samples replica stacks without holding their frames: a
    frame object keeps its locals alive past the function's return, and on PJRT a lazy
    tensor kept alive that way changes the replica's next graph (XLA aborted W=8 worlds).
    A slow stack classifier widens the window in which a held frame would show."""
    import threading
    import types
    import weakref
    from conformance.worlds import blame, host

    def slow_collective_in(text, *a, **k):
        time.sleep(0.02)
        return None

    monkeypatch.setattr(blame, "collective_in", slow_collective_in)
    ctx = types.SimpleNamespace(progress=_Progress(threading.get_ident()))
    threading.Thread(target=host.watch_collectives, args=([ctx, ctx],),
                     kwargs={"every": 0.001}, daemon=True).start()

    def step():
        local = type("Lazy", (), {})()
        time.sleep(0.005)  # the watch samples while this frame runs
        return weakref.ref(local)

    survived = sum(step()() is not None for _ in range(200))
    assert survived == 0, f"{survived} of 200 locals outlived their frame"


def test_session_prestarts_the_worlds_its_implementations_train_on():
    """Session.prestart maps each implementation to its world (an SPMD row: one process over a
    W-device mesh), skips one unsupported on the runtime, and raises nothing for one that
    cannot be resolved (evaluate() reports it)."""
    from conformance.evaluate import Session

    class Prestarts(Pool):
        def __init__(self):
            self.started = []

        def get(self, world):
            raise AssertionError("nothing is run")

        def prestart(self, world):
            self.started.append(world)

        def close(self):
            pass

    pool = Prestarts()
    Session(pool=pool).prestart("pjrt", 2, ["torch", "ref", "xla_spmd", "nosuch.module:DDP"])
    assert [(k.world, k.replicas) for k in pool.started] == [("pjrt", 2), ("pjrt_spmd:2", 1)]
