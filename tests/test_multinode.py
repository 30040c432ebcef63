"""Past one machine: the CPU runtime under an external launcher.

Two torchrun "nodes" run on this machine as two subprocesses (node rank 0 and
1, ``--nnodes=2 --nproc-per-node=2``, static rendezvous at 127.0.0.1 on a free
port), every worker running ``python -m conformance ... --launcher env``: a world
of 4 replicas on 2 hosts x 2 local ordinals. Every launch is bounded by a
timeout, and on any failure both launchers and all their workers are killed by
pid (no orphans).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conformance
from tests.procs import alive, descendants

pytestmark = pytest.mark.cpu

REPO = Path(conformance.__file__).resolve().parents[1]
LAUNCH_TIMEOUT = float(os.environ.get("CONFORMANCE_MULTINODE_TIMEOUT", 300))
# What an outer launcher may have set: the nodes must not inherit it.
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_USE_AGENT_STORE")


def torchrun() -> list[str]:
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_worker(pid: int) -> bool:
    """A torchrun worker of these tests: its command line runs ``-m conformance``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return any(a == b"-m" and b == b"conformance" for a, b in zip(args, args[1:]))


def workers(procs) -> list[int]:
    """The live worker processes the launchers ``procs`` have started (not the launchers)."""
    return [pid for p in procs for pid in descendants(p.pid) if _is_worker(pid) and alive(pid)]


def kill_launch(procs) -> list[int]:
    """SIGTERM each launcher (it stops its workers), then SIGKILL whatever of it is left, by pid.

    Returns every pid it handled (launchers and their descendants)."""
    tree = {p.pid: descendants(p.pid) for p in procs}
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(x) for p in procs for x in [p.pid, *tree[p.pid]]):
        time.sleep(0.2)
    for p in procs:
        for pid in [*tree[p.pid], p.pid]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass
    return [x for p in procs for x in [p.pid, *tree[p.pid]]]


class LaunchTimeout(AssertionError):
    """The launch did not finish in time and was killed; ``pids`` are the processes killed."""

    def __init__(self, text, pids, workers=()):
        super().__init__(text)
        self.pids, self.workers = pids, list(workers)


class Launch:
    def __init__(self, rcs, logs, wall, json_doc):
        self.rcs, self.logs, self.wall, self.json = rcs, logs, wall, json_doc

    def all_logs(self) -> str:
        return "\n".join(f"===== node {n} =====\n{log[-6000:]}" for n, log in enumerate(self.logs))


def launch_two_nodes(tmp_path, *cli_args, json_path=None, timeout=LAUNCH_TIMEOUT, rdzv="static",
                     timeout_from="launch") -> Launch:
    """Run ``python -m conformance <cli_args>`` on 2 torchrun nodes x 2 processes; wait for both.

    ``rdzv``: ``static`` (``--node-rank``, ``--master-addr``/``--master-port``) or
    ``c10d`` (elastic rendezvous at 127.0.0.1; torchrun assigns the node ranks).
    ``timeout_from``: ``launch`` (``timeout`` counts from the launchers' start) or
    ``workers`` (it counts from the moment all 4 workers run, however long the launchers
    took to start them on a loaded machine; they must within :data:`LAUNCH_TIMEOUT`).
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    procs, logs = [], []
    start = time.monotonic()
    try:
        for node in (0, 1):
            log = tmp_path / f"node{node}.log"
            logs.append(log)
            with open(log, "w") as out:
                where = ([f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}"]
                         if rdzv == "static" else
                         ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=conf{port}"])
                procs.append(subprocess.Popen(
                    [*torchrun(), "--nnodes=2", "--nproc-per-node=2", *where, "--max-restarts=0",
                     "-m", "conformance", *cli_args],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path, env=env))
        deadline = start + timeout
        if timeout_from == "workers":
            up = []
            while time.monotonic() < start + LAUNCH_TIMEOUT and all(p.poll() is None for p in procs):
                up = workers(procs)
                if len(up) >= 4:
                    break
                time.sleep(0.2)
            if len(up) < 4:
                kill_launch(procs)
                text = "\n".join(f"===== node {n} =====\n{log.read_text()[-6000:]}" for n, log in enumerate(logs))
                raise AssertionError(f"the launchers started {len(up)} of 4 workers within "
                                     f"{time.monotonic() - start:.0f} s (rcs {[p.poll() for p in procs]})\n{text}")
            workers_up = time.monotonic() - start
            print(f"the 4 workers ran {workers_up:.1f} s after the launchers started")
            deadline = time.monotonic() + timeout
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        running = workers(procs)
        pids = kill_launch(procs)
        text = "\n".join(f"===== node {n} =====\n{log.read_text()[-6000:]}" for n, log in enumerate(logs))
        raise LaunchTimeout(f"the two-node launch did not finish within {timeout:.0f} s; killed it.\n{text}",
                            pids, running) from None
    finally:
        kill_launch([p for p in procs if p.poll() is None])  # an exception above: no orphans
    wall = time.monotonic() - start
    doc = json.loads(Path(json_path).read_text()) if json_path and Path(json_path).exists() else None
    return Launch([p.returncode for p in procs], [log.read_text() for log in logs], wall, doc)


def assert_no_orphans(pids):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if alive(p)], "worker processes outlived their launchers"


def assert_two_hosts_two_local(check):
    assert check["violations"] == [], check["violations"]
    assert check["world_size"] == 4 and check["hosts"] == ["0", "1"]
    reports = check["reports"]
    assert sorted(r["bindings"]["process_index"] for r in reports) == [0, 1, 2, 3]
    for host in ("0", "1"):
        mine = [r["bindings"] for r in reports if r["host"] == host]
        assert sorted(b["local_ordinal"] for b in mine) == [0, 1], (host, mine)
    for ordinal, r in enumerate(reports):
        b = r["bindings"]
        assert b["global_ordinal"] == ordinal == r["ctx_rank"]
        assert (b["world_size"], b["process_count"], b["local_device_count"]) == (4, 4, 1)
        assert r["dist"] == {"rank": ordinal, "world_size": 4}
    assert len({r["pid"] for r in reports}) == 4


def test_two_nodes_parity_and_rank_invariants(tmp_path):
    out = tmp_path / "report.json"
    launch = launch_two_nodes(tmp_path, "run", "--runtime", "cpu", "--launcher", "env",
                              "--only", "parity.linear,parity.batchnorm,invariant.ranks", "--ddp", "torch,ref",
                              "--json", str(out), json_path=out)
    print(f"two-node run (2 x torchrun --nproc-per-node=2): {launch.wall:.1f} s wall")
    assert launch.rcs == [0, 0], launch.all_logs()
    doc = launch.json
    assert doc is not None, launch.all_logs()
    assert doc["launch"]["world_size"] == 4 and doc["launch"]["nnodes"] == 2
    verdicts = doc["verdicts"]
    assert {(v["check"], v["impl"], v["model"]) for v in verdicts} == {
        (c, i, m) for i in ("torch", "ref") for m in ("linear", "batchnorm")
        for c in (("param_parity", "loss_parity", "agreement", "transparency")
                  + (("buffer_parity",) if m == "batchnorm" else ()))
    } | {("ranks", i, "-") for i in ("torch", "ref")}
    assert all(v["status"] == "pass" and v["world_size"] == 4 for v in verdicts), verdicts
    ranks = [v for v in verdicts if v["case"] == "invariant.ranks"]
    assert all("on 2 host(s)" in v["reason"] for v in ranks), ranks
    # Only rank 0 (node 0) prints the table; node 1's workers print none.
    assert "param_parity" in launch.logs[0] and "20 pass, 0 fail" in launch.logs[0]
    assert "param_parity" not in launch.logs[1]
    assert_no_orphans([m["pid"] for m in doc["launch"]["members"]])


def test_two_nodes_mutant_exits_1(tmp_path):
    out = tmp_path / "report.json"
    launch = launch_two_nodes(tmp_path, "run", "--runtime", "cpu", "--launcher", "env",
                              "--only", "parity.linear,parity.batchnorm", "--ddp", "mutant:no_grad_sync",
                              "--json", str(out), json_path=out)
    print(f"two-node mutant run: {launch.wall:.1f} s wall")
    assert launch.rcs == [1, 1], launch.all_logs()
    assert launch.json is not None, launch.all_logs()
    statuses = {(v["check"], v["model"]): v["status"] for v in launch.json["verdicts"]}
    assert statuses[("param_parity", "linear")] == "fail" and statuses[("param_parity", "batchnorm")] == "fail"
    assert all(v["world_size"] == 4 for v in launch.json["verdicts"])
    assert_no_orphans([m["pid"] for m in launch.json["launch"]["members"]])


@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_two_nodes_ranks_subcommand(tmp_path, rdzv):
    out = tmp_path / "ranks.json"
    launch = launch_two_nodes(tmp_path, "ranks", "--launcher", "env", "--json", str(out), json_path=out,
                              rdzv=rdzv)
    assert launch.rcs == [0, 0], launch.all_logs()
    # rank 0 prints; with c10d torchrun decides which node hosts it
    assert sum("rank invariants (cpu, world size 4, 2 host(s)): ok" in log for log in launch.logs) == 1
    [check] = launch.json["ranks"]
    assert_two_hosts_two_local(check)


def test_launch_timeout_kills_both_nodes(tmp_path):
    """The test's own bound: a launch over time is killed with all its workers.

    The bound (10 s) counts from the moment the four workers run, not from the launchers'
    start: on a loaded machine two torchruns take longer than 10 s to start four workers
    (the launch would be killed before it had workers to kill). The run (whole table and kill
    matrix) takes minutes on a quiet machine, so it is over time in any case."""
    with pytest.raises(LaunchTimeout) as info:
        launch_two_nodes(tmp_path, "run", "--launcher", "env", "--ddp", "torch,ref", "--mutants",
                         "--json", str(tmp_path / "r.json"), timeout=10, timeout_from="workers")
    pids, running = info.value.pids, info.value.workers
    assert len(running) == 4, running   # the four workers still ran when the bound passed
    assert set(running) <= set(pids), (running, pids)   # and they were among the killed
    assert len(pids) >= 2 + 4, pids  # two launchers and (at least) their four workers
    assert_no_orphans(pids)


# --- without a launcher: the errors are one line, exit code 2 -------------------

def run_cli(*args, env_extra=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


FAKE_LAUNCH = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "1"}


@pytest.mark.parametrize("args,env,needle", [
    (["run", "--launcher", "env"], None, "not started by an env:// launcher"),
    (["ranks", "--launcher", "env"], None, "not started by an env:// launcher"),
    (["run", "--launcher", "env", "--world-size", "2"], FAKE_LAUNCH, "the launcher started 4 processes"),
    (["run", "--launcher", "env", "--runtime", "pjrt"], FAKE_LAUNCH, "runtime pjrt cannot run under"),
    (["ranks", "--launcher", "env", "--world-size", "2"], FAKE_LAUNCH, "the launcher started 4 processes"),
])
def test_launcher_env_usage_errors(args, env, needle):
    r = run_cli(*args, env_extra=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --launcher env: "), r.stderr
    assert needle in lines[0], lines[0]


def test_external_pool_refuses_other_world_size(monkeypatch):
    from conformance.worlds.launched import ExternalPool, WorldSizeMismatch, launched
    from conformance.worlds.registry import WorldKey
    for k, v in FAKE_LAUNCH.items():
        monkeypatch.setenv(k, v)
    assert launched()
    pool = ExternalPool("cpu")
    with pytest.raises(WorldSizeMismatch, match="launcher started 4 processes.*not 2"):
        pool.get(WorldKey("cpu", 2))
    assert pool.world is None  # nothing was initialised


def test_ranks_subcommand_spawn():
    r = run_cli("ranks", "--world-size", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank invariants (cpu, world size 3, 1 host(s)): ok" in r.stdout
