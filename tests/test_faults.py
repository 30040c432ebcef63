"""Fault injection: every way a replica can fail is reported in bounded time, with
the right class, the right replica named, its exception or stacks, and no process
left behind. One table, run on the CPU runtime (marker ``cpu``) and on PJRT
(marker ``pjrt``; skipped with the reason where torch_xla cannot run).

Each case runs :func:`tests.tasks.fault` (a training-shaped loop: forward,
an all-reduce whose size changes per step, step sync) on a fresh world of 2
replicas with a short task bound (:data:`TIMEOUT_S`), with the fault on
replica :data:`K` at step 1. Bounds are limits a hang would blow through, not timing
assertions: written for a quiet machine, each is multiplied by the load scale measured in
the same test (:func:`tests.procs.load_scale`: the world's start-up against a quiet one).
A second table (:data:`SCRATCH_FAULTS`) puts the fault inside a from-scratch DDP's own
collectives, which the kit does not instrument: the culprit is found from stacks.
"""
import os
from dataclasses import replace
import signal
import subprocess
import sys
import threading
import time

import pytest

from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime
from tests.tasks import fault
from conformance.worlds.failure import ReplicaDied, ReplicaError, ReplicaFailed, ReplicaTimeout
from conformance.worlds.pool import Pool
from conformance.worlds.spawned import World

from tests.procs import default_signals, descendants, gone, measured_scale, start_world, world_hosts

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
    # a raise on CPU keeps the world (every replica back in its task loop), the rest break it
    assert world.broken is not (runtime == "cpu" and how == "raise")
    assert gone(pids, within=10 * scale), "a host process outlived the failure report"
    return info.value, elapsed, scale


def _check_diagnosis(err):
    assert [d["rank"] for d in err.diagnosis] == [0, 1]
    for d in err.diagnosis:
        assert d["status"] in ("raised", "hung", "died", "waiting", "aborted-by-peer", "ok")
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
        assert summary.startswith(f"replica {K} "), summary  # the table's first sentence says who
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


def _kill_when_asleep(world, victim, stop, task=1):
    """SIGKILL ``victim`` once replica K has noted step 1 of ``task`` (where it sleeps): an
    ordering, not a wall time. A kill at a load-scaled time came after the PJRT peer's collective
    bound (6 s, fixed below XLA's own abort) under load 9: a timeout, not a death, was reported."""
    from conformance.worlds.diagnosis import read_board
    while not stop.is_set():
        b = read_board(world._board, world.world_size)[K]
        if b.get("task") == task and b.get("step") == 1:
            stop.wait(0.5)  # into the sleep, the peer into its collective
            if not stop.is_set():
                os.kill(victim, signal.SIGKILL)
            return
        stop.wait(0.05)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_replica_killed_from_outside(runtime):
    _available(runtime)
    world, scale = start_world(runtime, 2, timeout=TIMEOUT_S)
    pids = world.pids()
    victim = pids[K] if len(pids) > K else pids[0]  # PJRT: one host holds every replica
    stop = threading.Event()
    killer = threading.Thread(target=_kill_when_asleep, args=(world, victim, stop), daemon=True)
    t0 = time.monotonic()
    killer.start()
    try:
        with pytest.raises(ReplicaDied) as info:
            world.run(fault, timeout=TIMEOUT_S * scale, rank=K, how="sleep", seconds=TIMEOUT_S * 3 * scale)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        world.close()
    err = info.value
    _check_diagnosis(err)
    assert elapsed <= (TIMEOUT_S + SLACK_S) * scale, f"reported after {elapsed:.1f} s (load x{scale:.1f})"
    assert "killed by SIGKILL" in err.summary() and f"replica {K}" in err.summary()
    assert err.diagnosis[K]["status"] == "died" and err.diagnosis[K]["signal"] == "SIGKILL"
    assert [d["rank"] for d in err.diagnosis if d["culprit"]] == [K]
    assert gone(pids, within=10 * scale)


# (runtime, --world-size, world host processes the CLI has when it is interrupted, pause before
# it): a running world; (CPU) 4: both lanes' W=2 worlds running cases (conformance.cli.lanes);
# and (CPU) 5: W=2 and W=3 worlds up, interrupted at once, maybe while one starts.
SIGINT_RUNS = [pytest.param("cpu", "2", 1, 1.0, marks=pytest.mark.cpu, id="cpu"),
               pytest.param("cpu", "2", 4, 0.5, marks=pytest.mark.cpu, id="cpu-two-lanes"),
               pytest.param("pjrt", "2", 1, 1.0, marks=pytest.mark.pjrt, id="pjrt"),
               pytest.param("cpu", "2,3", 5, 0.0, marks=pytest.mark.cpu, id="cpu-next-world-starting")]


@pytest.mark.parametrize("runtime, sizes, processes, pause", SIGINT_RUNS)
def test_sigint_to_cli_parent_leaves_nothing(runtime, sizes, processes, pause, tmp_path):
    """Ctrl-C to ``python -m conformance run``: exit 130 with one ``error:`` line, no host left."""
    _available(runtime)
    scale = measured_scale()
    env = dict(os.environ, CONFORMANCE_TIMEOUT=str(TIMEOUT_S * 10 * scale))
    cmd = [sys.executable, "-m", "conformance", "run", "--runtime", runtime, "--ddp", "ref",
           "--world-size", sizes, "--json", str(tmp_path / "r.json")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_signals,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        deadline = time.monotonic() + 60 * scale
        hosts = []
        while time.monotonic() < deadline and len(hosts) < processes and proc.poll() is None:
            time.sleep(0.1)
            hosts = world_hosts(proc.pid)
        assert len(hosts) >= processes, (f"the CLI had {len(hosts)} of {processes} world host processes after "
                                         f"{60 * scale:.0f} s (load x{scale:.1f})")
        time.sleep(pause * scale)
        hosts = sorted(set(hosts) | set(descendants(proc.pid)))  # and the fork server
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        bound = (TIMEOUT_S + SLACK_S) * scale
        _, err = proc.communicate(timeout=bound)
        assert time.monotonic() - t0 <= bound
        assert proc.returncode == 130, err[-2000:]
        assert "interrupted by SIGINT" in err and "partial report" in err, err[-2000:]
        assert gone(hosts, within=10 * scale), "host processes outlived the interrupted CLI"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.cpu
def test_spawned_world_ignores_parent_launcher_variables(monkeypatch):
    """A kit-spawned world started from inside a torchrun job (launcher variables
    exported) keeps its own layout: ranks 0..W-1 on its own emulated hosts (W=2: 2 hosts
    x 1, conformance.settings.DEFAULT_CPU_HOSTS), not the parent's GROUP_RANK / LOCAL_RANK."""
    from conformance.cases.invariant.kind import rank_report
    for var, value in {"GROUP_RANK": "1", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(var, value)
    with World("cpu", 2, timeout=60) as world:
        reports = world.run(rank_report)
    assert [r["host"] for r in reports] == ["0", "1"]
    assert [r["bindings"]["global_ordinal"] for r in reports] == [0, 1]
    assert [r["bindings"]["local_ordinal"] for r in reports] == [0, 0]
    assert [r["dist"] for r in reports] == [{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}]


# --- faults inside a from-scratch DDP's own torch.distributed calls -------------
# The kit's instrumented collectives (ctx.collectives) are not used here: the DDP
# calls torch.distributed itself, as a user's DDP does, so the kit can only
# classify from the replicas' stacks.

SCRATCH_FAULTS = ("hang", "skip", "stall")
STALL_MIB = 200      # what the stalling replica allocates before it stalls


def _hang_in_backward(seconds):
    time.sleep(seconds)  # the frame the report must show


def _stall_after_allocating(seconds):
    import torch
    ballast = torch.ones(STALL_MIB * 2 ** 18)  # float32: STALL_MIB MiB, touched
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # busy, not asleep: a stalled replica burns CPU
        pass
    return ballast


class ScratchDDP:
    """Data parallelism written from scratch (not the kit's reference DDP): each
    gradient all-reduced and averaged by a post-accumulate-grad hook as backward
    produces it, with ``torch.distributed`` (parameters broadcast from rank 0 at
    wrap) or, on ``xla``, ``xm.all_reduce`` (replicas seed alike; the collectives
    run in the step sync). ``fault`` (rank 1, step 1, first hook) is ``hang``
    (sleeps in backward), ``skip`` (skips that all-reduce) or ``stall``
    (allocates, then spins)."""

    def __init__(self, module, rank, world_size, fault=None, seconds=600.0, xla=False):
        self.module, self.rank, self.world_size, self.xla = module, rank, world_size, xla
        self.fault, self.seconds, self.step = fault, seconds, 0
        self._hooks_this_step = 0
        for p in module.parameters():
            if not xla:
                import torch.distributed as dist
                dist.broadcast(p.data, src=0)
            p.register_post_accumulate_grad_hook(self._reduce)

    def __call__(self, x):
        self._hooks_this_step = 0
        return self.module(x)

    def _reduce(self, p):
        first = self._hooks_this_step == 0
        self._hooks_this_step += 1
        if first and self.rank == 1 and self.step == 1:
            if self.fault == "hang":
                _hang_in_backward(self.seconds)
            elif self.fault == "stall":
                _stall_after_allocating(self.seconds)
            elif self.fault == "skip":
                return
        if self.xla:
            import torch_xla.core.xla_model as xm
            p.grad.copy_(xm.all_reduce(xm.REDUCE_SUM, p.grad, scale=1.0 / self.world_size))
        else:
            import torch.distributed as dist
            dist.all_reduce(p.grad)
            p.grad /= self.world_size


def scratch_ddp_fault(ctx, how, steps=3, seconds=600.0) -> int:
    """Train a 3-layer MLP under :class:`ScratchDDP` with fault ``how``; return the rank.
    The layers have the same size, so a skipped all-reduce pairs with the next one
    instead of a size mismatch (gloo aborts on those)."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8, bias=False) for _ in range(3)]).to(ctx.device)
    ddp = ScratchDDP(model, ctx.rank, ctx.world_size, fault=how, seconds=seconds, xla=ctx.runtime == "pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(ctx.rank)
    for step in range(steps):
        ddp.step = step
        ctx.note(step=step, phase="forward")
        loss = ddp(torch.randn(4, 8, generator=data).to(ctx.device)).square().mean()
        ctx.note(phase="backward")
        loss.backward()
        ctx.note(phase="optimizer step")
        opt.step()
        opt.zero_grad()
        ctx.mark_step()  # XLA: the step's all-reduces run here
    return ctx.rank


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("how", SCRATCH_FAULTS)
def test_fault_inside_scratch_ddp_names_the_culprit(runtime, how):
    """Replica 1 misbehaves inside a from-scratch DDP's backward while replica 0 waits in
    the DDP's own ``torch.distributed.all_reduce`` (PJRT: in the step sync that runs its
    ``xm.all_reduce``): replica 1 is the culprit (with the stack of where it is), replica 0
    a waiter, within the task bound."""
    _available(runtime)
    if runtime == "pjrt" and how == "skip":
        pytest.skip("unsupported: on XLA the skipped all-reduce only changes replica 1's compiled graph; "
                    "both replicas then wait in the step sync and no stack or progress shows which skipped")
    world = World(runtime, 2, timeout=TIMEOUT_S)
    pids = world.pids()
    try:
        # first the same task without a fault: its imports (torch.optim, ...) would take
        # most of the short bound on a loaded machine
        assert world.run(scratch_ddp_fault, timeout=120, how=None) == [0, 1]
        t0 = time.monotonic()
        with pytest.raises(ReplicaError) as info:
            world.run(scratch_ddp_fault, how=how)
        elapsed = time.monotonic() - t0
    finally:
        world.close()
    assert gone(pids), "a host process outlived the failure report"
    err = info.value
    summary = err.summary()
    assert isinstance(err, ReplicaTimeout), f"{how}: {type(err).__name__}: {summary}"
    assert elapsed <= TIMEOUT_S + SLACK_S, f"{how}: reported after {elapsed:.1f} s"
    _check_diagnosis(err)
    assert [d["rank"] for d in err.diagnosis if d["culprit"]] == [K], summary
    waiter, culprit = err.diagnosis[1 - K], err.diagnosis[K]
    assert waiter["status"] == "waiting", summary
    collective, frame = {"cpu": ("all_reduce", "distributed_c10d.py"), "pjrt": ("mark_step", "mark_step")}[runtime]
    assert collective in (waiter["in_collective"] or ""), summary
    assert frame in (waiter["stacks"] or "")
    assert summary.startswith(f"replica {K} ") and collective in summary, summary
    if how == "skip":  # it went on and returned: one all-reduce short
        assert culprit["status"] == "ok", summary
    else:
        assert culprit["status"] == "hung", summary
        frame = {"hang": "_hang_in_backward", "stall": "_stall_after_allocating"}[how]
        assert frame in (culprit["stacks"] or ""), culprit["stacks"]
        assert frame in summary  # its innermost frame, in the one line
        assert (culprit["step"], culprit["phase"]) == (1, "backward")
    if how == "stall" and runtime == "cpu":  # its resident set shows the allocation (PJRT: one host)
        assert culprit["rss_mib"] - waiter["rss_mib"] >= 0.8 * STALL_MIB, summary


# --- the blame decision alone (no world) ----------------------------------------

SITE = "/venv/lib/python3.11/site-packages"
WAITER_STACK = f"""Current thread 0x00007fa2f2641b80 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/mydp.py", line 41 in _reduce
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/home/u/train.py", line 9 in main
"""
SLEEPER_STACK = f"""Current thread 0x00007fdc3163bb80 (most recent call first):
  File "/home/u/mydp.py", line 30 in _reduce
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/home/u/train.py", line 9 in main
"""
# What replica 0 raised in the user's measurement: gloo's own timeout, out of all_reduce.
GLOO_TIMEOUT_TB = f"""Traceback (most recent call last):
  File "/home/u/mydp.py", line 41, in _reduce
    dist.all_reduce(p.grad)
  File "{SITE}/torch/distributed/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252, in all_reduce
    work.wait()
RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 60000ms for recv operation to complete
"""


# A DDP whose communication thread hangs (tests/outside/comm_thread_ddp.py, found from outside):
# the replica's main thread waits for that thread through threading; the hang is in the other.
MAIN_WAITS_FOR_COMM_THREAD = f"""Current thread 0x00007fad1bd41b80 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/home/u/commdp.py", line 160 in _end_of_backward
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/home/u/train.py", line 9 in main

Thread 0x00007fad18c106c0 (most recent call first):
  File "/home/u/commdp.py", line 199 in _before_all_reduce
  File "/home/u/commdp.py", line 108 in _reduce
  File "/home/u/commdp.py", line 98 in _comm_loop
  File "/usr/lib/python3.11/threading.py", line 982 in run
"""


def test_where_a_replica_is_skips_threads_waiting_for_its_other_threads():
    """The one-line 'hung at' of a culprit is the thread doing something, not its main thread
    waiting on an Event for it; when every thread waits, the first one is still named."""
    from conformance.worlds.stacks import top_frame
    assert top_frame(MAIN_WAITS_FOR_COMM_THREAD).startswith("u/commdp.py:199 in _before_all_reduce")
    idle = MAIN_WAITS_FOR_COMM_THREAD.split("\n\nThread")[0]
    assert top_frame(idle).startswith("python3.11/threading.py:327 in wait")
    assert top_frame(SLEEPER_STACK).startswith("u/mydp.py:30 in _reduce")


def _replica(rank, status, stack=None, **kw):
    from conformance.worlds.blame import collective_in
    return {"rank": rank, "host": rank, "status": status,
            "in_collective": kw.pop("in_collective", None) or collective_in(stack or ""), **kw}


def test_collective_in_recognises_torch_distributed_and_xla_frames():
    from conformance.worlds.blame import collective_in
    assert collective_in(WAITER_STACK) == "torch.distributed.all_reduce at u/mydp.py:41 in _reduce"
    assert collective_in(GLOO_TIMEOUT_TB) == "torch.distributed.all_reduce at u/mydp.py:41 in _reduce"
    assert collective_in(SLEEPER_STACK) is None
    xla = (f'  File "{SITE}/torch_xla/core/xla_model.py", line 1090 in mark_step\n'
           '  File "/u/t.py", line 3 in step\n')
    assert collective_in(xla) == "torch_xla.core.xla_model.mark_step at u/t.py:3 in step"
    # an innermost user frame at `handle.wait()` is dist.Work.wait (C++: no frame of its own) ...
    work = '  File "/u/dp.py", line 7 in finish\n  File "/u/t.py", line 3 in step\n'
    assert collective_in(work, source=lambda p, n: "        h.wait()\n") == "Work.wait at u/dp.py:7 in finish"
    # ... but threading.Event.wait has Python frames below the user's line
    event = f'  File "/usr/lib/python3.11/threading.py", line 320 in wait\n{work}'
    lines = {"/u/dp.py": "        h.wait()\n", "/usr/lib/python3.11/threading.py": "    waiter.acquire()\n"}
    assert collective_in(event, source=lambda p, n: lines[p]) is None


def test_collective_in_recognises_the_kit_runtime_frames():
    """A DDP that calls ddp_impl's collectives or step sync (the reference DDP's runtime) is
    seen waiting there from its stack alone; the recognised files exist (they moved once, to
    ddp_impl/runtime/, and the old paths silently matched nothing)."""
    import ddp_impl
    from conformance.worlds.blame import _LIBRARIES, _SYNCS, collective_in
    root = os.path.dirname(os.path.dirname(os.path.abspath(ddp_impl.__file__)))
    for rel in [r for r in _LIBRARIES + tuple(_SYNCS) if r.startswith("ddp_impl/")]:
        assert os.path.isfile(os.path.join(root, rel)), f"{rel}: no such file in the kit"
    sync = (f'  File "{root}/ddp_impl/runtime/xla.py", line 200 in mark_step\n'
            '  File "/u/t.py", line 3 in step\n')
    assert collective_in(sync) == "ddp_impl.runtime.xla.mark_step at u/t.py:3 in step"
    reduce = (f'  File "{root}/ddp_impl/runtime/xla.py", line 360 in all_reduce_\n'
              '  File "/u/dp.py", line 9 in _hook\n')
    assert collective_in(reduce) == "ddp_impl.runtime.xla.all_reduce_ at u/dp.py:9 in _hook"


class NoPool(Pool):
    """A pool the test never asks for a world."""

    def get(self, world):
        raise AssertionError(f"no world is needed here, asked for {world}")

    def close(self):
        pass


@pytest.mark.parametrize("culprits, column", [([1], 1), ([0, 1], None)])
def test_world_failure_verdicts_fill_the_replica_column_only_for_one_culprit(monkeypatch, culprits, column):
    """The table's replica column says who failed; with several culprits none stands out (the
    reason names them all), so the column stays empty rather than showing the first."""
    import conformance.evaluate as ev
    from conformance.cases.table import CASES
    case = CASES["parity.linear"]
    diag = [{"rank": r, "culprit": r in culprits, "step": 2} for r in (0, 1)]

    def fails(*args, **kwargs):
        raise ReplicaTimeout("cpu world of 2 replica(s): task t: no answer\ndetails", diag)
    monkeypatch.setitem(ev.KINDS, case.kind, replace(ev.KINDS[case.kind], evaluate=fails))
    verdicts = ev.evaluate(case, "ref", "cpu", 2, session=ev.Session(pool=NoPool()))
    assert verdicts and {(v.status, v.replica, v.first_bad_step) for v in verdicts} == {("fail", column, 2)}


def test_blame_measured_case_gloo_timeout_raised_by_the_waiter():
    """The user's measurement: replica 0 raised gloo's timeout inside the DDP's own
    all_reduce while replica 1 slept in backward. Replica 1 is the culprit."""
    from conformance.worlds.blame import blame
    v = blame([_replica(0, "raised", GLOO_TIMEOUT_TB), _replica(1, "hung", SLEEPER_STACK)])
    assert v.culprits == [1] and v.status == {0: "waiting", 1: "hung"}
    assert "outside any collective" in v.reason[1]


@pytest.mark.parametrize("case, culprits, status", [
    # hang in user code / stall: the one outside any collective
    ([("hung", WAITER_STACK), ("hung", SLEEPER_STACK)], [1], ["waiting", "hung"]),
    # skipped collective: the one that returned
    ([("hung", WAITER_STACK), ("ok", None)], [1], ["waiting", "ok"]),
    # raised in its own code: the raiser; the waiter was cut off
    ([("hung", WAITER_STACK), ("raised", None)], [1], ["aborted-by-peer", "raised"]),
    # died: the dead one
    ([("hung", WAITER_STACK), ("died", None)], [1], ["aborted-by-peer", "died"]),
    # nobody inside a collective: every replica still running
    ([("hung", SLEEPER_STACK), ("hung", SLEEPER_STACK)], [0, 1], ["hung", "hung"]),
    # one sleeps, the other returned without any collective: the sleeper
    ([("hung", SLEEPER_STACK), ("ok", None)], [0], ["hung", "ok"]),
])
def test_blame_by_evidence(case, culprits, status):
    from conformance.worlds.blame import blame
    v = blame([_replica(r, s, stack) for r, (s, stack) in enumerate(case)])
    assert v.culprits == culprits and [v.status[r] for r in range(len(case))] == status


def test_blame_odd_one_out_when_every_replica_waits():
    """Three replicas all inside collectives, one in an earlier one (it skipped or
    added one): that one is the culprit."""
    from conformance.worlds.blame import blame
    ds = [_replica(r, "hung", in_collective="all_reduce_ float32[4]", collectives=4) for r in range(3)]
    ds[2].update(collectives=3)
    v = blame(ds)
    assert v.culprits == [2] and v.status[0] == v.status[1] == "waiting"


def test_blame_threads_of_one_dead_host():
    """PJRT: one host holds every replica; when it dies, the replica thread outside
    any collective is the culprit, not the ones waiting in one."""
    from conformance.worlds.blame import blame
    v = blame([{"rank": 0, "host": 0, "status": "died", "in_collective": "mark_step"},
               {"rank": 1, "host": 0, "status": "died", "in_collective": None}])
    assert v.culprits == [1]


def _thread_in_fake_all_reduce():
    """A thread blocked in a function whose frame reads as torch.distributed.all_reduce
    (compiled under that file name); returns (thread, event that releases it)."""
    ns = {}
    exec(compile("def all_reduce(release):\n    release.wait(30)\n",
                 f"{SITE}/torch/distributed/distributed_c10d.py", "exec"), ns)
    release = threading.Event()
    t = threading.Thread(target=ns["all_reduce"], args=(release,), daemon=True)
    t.start()
    return t, release


def test_launched_replica_says_whether_it_waits_in_a_collective(capfd):
    """A launcher-started world cannot see its peers: at its bound a stuck replica
    prints whether it waits in a collective or is outside any (the likely culprit)."""
    from conformance.worlds.launched import ExternalWorld
    w = ExternalWorld.__new__(ExternalWorld)  # its __init__ needs a launcher
    w.rank, w.members = 1, [{"host": "0"}, {"host": "0"}]
    w._dump_stacks(3, scratch_ddp_fault, 10.0)
    assert "it is outside any collective" in capfd.readouterr().err
    t, release = _thread_in_fake_all_reduce()
    try:
        w._dump_stacks(3, scratch_ddp_fault, 10.0)
        assert "it waits in torch.distributed.all_reduce" in capfd.readouterr().err
    finally:
        release.set()
        t.join()


@pytest.mark.cpu
def test_collective_bound_applies_to_scratch_ddp_collectives():
    """The hosts sample each replica's stack: a replica inside the DDP's own
    all_reduce for longer than the collective bound while its peer sleeps elsewhere
    is reported then, not at the (here much longer) task bound."""
    world = World("cpu", 2, timeout=120)
    world.collective_bound = 3.0  # the CPU runtime's is 0.8 x gloo's timeout (48 s)
    pids = world.pids()
    try:
        assert world.run(scratch_ddp_fault, how=None) == [0, 1]  # imports (see above)
        t0 = time.monotonic()
        with pytest.raises(ReplicaTimeout) as info:
            world.run(scratch_ddp_fault, how="hang")
        elapsed = time.monotonic() - t0
    finally:
        world.close()
    assert gone(pids)
    err = info.value
    assert "collective bound" in err.summary(), err.summary()
    assert elapsed < 60, f"reported after {elapsed:.1f} s: the task bound, not the collective bound"
    assert [d["rank"] for d in err.diagnosis if d["culprit"]] == [K]
    assert err.diagnosis[1 - K]["status"] == "waiting" and err.diagnosis[1 - K]["waited_s"] >= 3.0


def test_a_collective_mismatch_blames_no_single_receiver():
    """gloo aborts the replica that *received* mismatched data (a from-scratch DDP whose replica 1
    skipped one all-reduce, found from outside): its death is a symptom. Both replicas sit in the
    same collective line, so both are named ``mismatched`` and neither is 'the one that died'."""
    from conformance.worlds.blame import blame
    gloo = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
            "gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 100 vs 12. Received data size "
            "doesn't match expected size. Is there a distributed collective mismatch in your code?")
    died = {"rank": 0, "host": 0, "status": "died", "signal": "SIGABRT", "log_tail": gloo,
            "in_collective": "torch.distributed.all_reduce", "last_collective": None}
    peer = {"rank": 1, "host": 1, "status": "hung", "in_collective": "torch.distributed.all_reduce",
            "last_collective": None}
    b = blame([died, peer])
    assert b.culprits == [0, 1] and b.status == {0: "mismatched", 1: "mismatched"}, b
    assert "collective mismatch" in b.reason[0]
    # a peer recorded in a different collective is named alone
    b = blame([dict(died, last_collective="all_reduce_ #3"), dict(peer, last_collective="broadcast_ #1")])
    assert b.culprits == [1] and "different collective" in b.reason[1], b


@pytest.mark.cpu
def test_hang_in_a_ddp_communication_thread_names_that_thread():
    """A from-scratch DDP that all-reduces on a thread of its own (tests/outside/comm_thread_ddp.py,
    written from outside the kit) and hangs there on replica 1: the verdict names replica 1 hung
    at the sleeping line of that thread, not its main thread's wait for it, and replica 0 as
    waiting in the DDP's all_reduce."""
    from conformance.cases.table import CASES
    from conformance.evaluate import Session, evaluate
    from conformance.settings import Settings
    scale = measured_scale()
    session = Session(settings=Settings().replace(replica_timeout=TIMEOUT_S * scale))
    try:
        verdicts = evaluate(CASES["parity.linear"], "tests.outside.comm_thread_ddp:CommThreadHangDDP", "cpu", 2,
                            session, shrink=False)
    finally:
        session.close()
    assert verdicts and all(v.status == "fail" for v in verdicts), [(v.id, v.status) for v in verdicts]
    reason = verdicts[0].reason
    assert "replica 1 hung outside any collective at outside/comm_thread_ddp.py:" in reason, reason
    assert "in _before_all_reduce: time.sleep(600)" in reason, reason
    assert "waiting: replica 0 in torch.distributed.all_reduce at outside/comm_thread_ddp.py:" in reason, reason


def test_a_mutant_whose_own_code_raises_is_not_a_kill():
    """A mutant that cannot run (its own code raises AttributeError) fails every case: that is
    no evidence of the case's power, so the kill row says survived with the reason."""
    from conformance.report.kills import KILLED, SURVIVED, KillRow
    from conformance.verdict import Verdict

    def failed(tb, etype="AttributeError"):
        d = {"rank": 0, "culprit": True, "exception_type": etype, "exception_message": "no attribute 'x'",
             "traceback": tb}
        return Verdict("parity.linear", "param_parity", "mutant:m", "cpu", "linear", 2, "fail", reason="raised",
                       replicas=[d])
    own = ('Traceback (most recent call last):\n  File "/k/conformance/impls/mutants/catalog.py", line 214, '
           'in __init__\n    h = torch.optim.optimizer.f()\nAttributeError: no attribute \'x\'\n')
    row = KillRow("cpu", 2, "m", "parity.linear", [failed(own)])
    assert row.result == SURVIVED and row.reason().startswith("not a kill: the mutant's own code raised "
                                                               "AttributeError"), row.reason()
    elsewhere = own.replace("conformance/impls/mutants/catalog.py", "ddp_impl/ddp.py")
    assert KillRow("cpu", 2, "m", "parity.linear", [failed(elsewhere)]).result == KILLED
    assert KillRow("cpu", 2, "m", "parity.linear", [failed(own, "RuntimeError")]).result == KILLED
