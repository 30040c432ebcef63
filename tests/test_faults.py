"""Fault injection: every way a replica can fail is reported in bounded time, with
the right class, the right replica named, its exception or stacks, and no process
left behind. One table, run on the CPU runtime (marker ``cpu``) and on PJRT
(marker ``pjrt``; skipped with the reason where torch_xla cannot run).

Each case runs :func:`conformance.worlds.tasks.fault` (a training-shaped loop: forward,
an all-reduce whose size changes per step, step sync) on a fresh world of 2
replicas with a short task bound (:data:`TIMEOUT_S`), with the fault on
replica :data:`K` at step 1. Bounds are limits a hang would blow through, not timing
assertions: written for a quiet machine, each is multiplied by the load scale measured in
the same test (:func:`tests.procs.load_scale`: the world's start-up against a quiet one).
"""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime
from conformance.worlds.tasks import fault
from conformance.worlds.spawned import ReplicaDied, ReplicaError, ReplicaFailed, ReplicaTimeout, World

from tests.procs import gone, measured_scale, start_world

K = 1                # the faulty replica
TIMEOUT_S = 8.0      # the task bound configured for each case (s, quiet machine; x load scale)
SLACK_S = 10.0       # report within TIMEOUT_S + SLACK_S (stack dump, teardown; x load scale)
RUNTIMES = [pytest.param("cpu", marks=pytest.mark.cpu), pytest.param("pjrt", marks=pytest.mark.pjrt)]

# how -> (error classes accepted, status of replica K, text that must be in the report)
# skip_collective: gloo aborts (SIGABRT) whichever replica receives a mismatched
# all-reduce and XLA waits in both rendezvous: a death or a hang, never a raise;
# the summary must show each replica's collective so the mismatch is visible.
CASES = {
    "raise": ((ReplicaFailed,), "raised", f"ValueError: injected fault on replica {K} at step 1"),
    "exit": ((ReplicaDied,), "died", "exited with code 3"),
    "sleep": ((ReplicaTimeout,), "hung", "in fault"),
    "skip_collective": ((ReplicaDied, ReplicaTimeout), None, "all_reduce_"),
}


def _available(runtime):
    try:
        get_runtime(runtime).check(2)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")


def _children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[-1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _run_fault(runtime, how, **kw):
    """``(error, seconds until it was reported, load scale)``."""
    _available(runtime)
    world, scale = start_world(runtime, 2, timeout=TIMEOUT_S)
    pids = world.pids()
    t0 = time.monotonic()
    try:
        with pytest.raises(ReplicaError) as info:
            world.run(fault, timeout=TIMEOUT_S * scale, rank=K, how=how, **kw)
        elapsed = time.monotonic() - t0
    finally:
        world.close()
    assert world.broken
    assert gone(pids, within=10 * scale), "a host process outlived the failure report"
    return info.value, elapsed, scale


def _check_diagnosis(err):
    assert [d["rank"] for d in err.diagnosis] == [0, 1]
    for d in err.diagnosis:
        assert d["status"] in ("raised", "hung", "died", "aborted-by-peer", "ok")
        assert d["pid"] and d["host"] is not None
    assert "\n" not in err.summary() and err.summary() in str(err)
    assert err.details() in str(err)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("how", list(CASES))
def test_fault_is_classified_and_named(runtime, how):
    err, elapsed, scale = _run_fault(runtime, how)
    classes, status, text = CASES[how]
    assert isinstance(err, classes), f"{how}: {type(err).__name__}: {err.summary()}"
    assert elapsed <= (TIMEOUT_S + SLACK_S) * scale, f"{how}: reported after {elapsed:.1f} s (load x{scale:.1f})"
    _check_diagnosis(err)
    summary = err.summary()
    assert f"replica {K}" in summary, summary
    assert text in str(err), f"{how}: {text!r} missing from the report"
    if status is not None:
        named = [d for d in err.diagnosis if d.get("culprit")]
        assert [d["rank"] for d in named] == [K], summary
        assert err.diagnosis[K]["status"] == status, summary
    if how == "raise":
        d = err.diagnosis[K]
        assert d["exception_type"] == "ValueError" and "raise ValueError" in d["traceback"]
        assert (d["step"], d["phase"]) == (1, "forward")
        assert "1 replica(s) raised" in summary  # the peer blocked in the all-reduce is not counted
        assert err.diagnosis[1 - K]["status"] == "aborted-by-peer"
    if how == "sleep":  # the hung replica's stack shows where it sleeps
        assert "fault" in (err.diagnosis[K]["stacks"] or "")
        assert err.diagnosis[K]["phase"] == "forward"
    if how == "skip_collective":
        assert not isinstance(err, ReplicaFailed)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_replica_killed_from_outside(runtime):
    _available(runtime)
    world, scale = start_world(runtime, 2, timeout=TIMEOUT_S)
    pids = world.pids()
    victim = pids[K] if len(pids) > K else pids[0]  # PJRT: one host holds every replica
    killer = threading.Timer(2.0 * scale, os.kill, args=(victim, signal.SIGKILL))
    t0 = time.monotonic()
    killer.start()
    try:
        with pytest.raises(ReplicaDied) as info:
            world.run(fault, timeout=TIMEOUT_S * scale, rank=K, how="sleep", seconds=TIMEOUT_S * 3 * scale)
        elapsed = time.monotonic() - t0
    finally:
        killer.cancel()
        world.close()
    err = info.value
    _check_diagnosis(err)
    assert elapsed <= (TIMEOUT_S + SLACK_S) * scale, f"reported after {elapsed:.1f} s (load x{scale:.1f})"
    assert "killed by SIGKILL" in err.summary() and f"replica {K}" in err.summary()
    assert err.diagnosis[K]["status"] == "died" and err.diagnosis[K]["signal"] == "SIGKILL"
    assert [d["rank"] for d in err.diagnosis if d["culprit"]] == [K]
    assert gone(pids, within=10 * scale)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_sigint_to_cli_parent_leaves_nothing(runtime, tmp_path):
    """Ctrl-C to ``python -m conformance run``: exit 130 with one ``error:`` line, no host left."""
    _available(runtime)
    scale = measured_scale()
    env = dict(os.environ, CONFORMANCE_TIMEOUT=str(TIMEOUT_S * 10 * scale))
    cmd = [sys.executable, "-m", "conformance", "run", "--runtime", runtime, "--ddp", "ref",
           "--world-size", "2", "--json", str(tmp_path / "r.json")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        deadline = time.monotonic() + 60 * scale
        hosts = []
        while time.monotonic() < deadline and not hosts and proc.poll() is None:
            time.sleep(0.2)
            hosts = _children(proc.pid)
        assert hosts, f"the CLI started no host process within {60 * scale:.0f} s (load x{scale:.1f})"
        time.sleep(1.0 * scale)
        hosts = sorted(set(hosts) | set(_children(proc.pid)))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        bound = (TIMEOUT_S + SLACK_S) * scale
        _, err = proc.communicate(timeout=bound)
        assert time.monotonic() - t0 <= bound
        assert proc.returncode == 130, err[-2000:]
        assert "error: interrupted" in err
        assert gone(hosts, within=10 * scale), "host processes outlived the interrupted CLI"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.cpu
def test_spawned_world_ignores_parent_launcher_variables(monkeypatch):
    """A kit-spawned world started from inside a torchrun job (launcher variables
    exported) keeps its own layout: ranks 0..W-1, one host, not the parent's."""
    from conformance.cases.ranks import rank_report
    for var, value in {"GROUP_RANK": "1", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(var, value)
    with World("cpu", 2, timeout=60) as world:
        reports = world.run(rank_report)
    assert [r["host"] for r in reports] == ["0", "0"]
    assert [r["bindings"]["global_ordinal"] for r in reports] == [0, 1]
    assert [r["bindings"]["local_ordinal"] for r in reports] == [0, 1]
    assert [r["dist"] for r in reports] == [{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}]
