"""Emulated hosts on the CPU runtime: a world's replicas grouped into H hosts with the launcher
variables torchrun gives a multi-node job, so faults that need two hosts are expressible (a
divisor or shard index taken from the local world). The default W=2 world is 2 hosts x 1."""
import json
import os

import pytest

from conformance.errors import UsageError
from conformance.settings import Settings, emulated_hosts
from conformance.worlds.runtimes import get_runtime

from .procs import REPO, run_cli

pytestmark = pytest.mark.cpu


def _layout(settings, w):
    envs = get_runtime("cpu", settings).host_envs(w)
    return [(e["RANK"], e["GROUP_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) for e in envs]


def test_torchrun_layout_of_emulated_hosts():
    assert _layout(Settings(), 2) == [("0", "0", "0", "1", "2"), ("1", "1", "0", "1", "2")]  # 2 hosts x 1
    assert _layout(Settings(), 3) == [(str(r), "0", str(r), "3", "1") for r in range(3)]    # 1 host x 3
    two_by_two = Settings(cpu_hosts=((4, 2),))
    assert _layout(two_by_two, 4) == [("0", "0", "0", "2", "2"), ("1", "0", "1", "2", "2"),
                                      ("2", "1", "0", "2", "2"), ("3", "1", "1", "2", "2")]
    with pytest.raises(UsageError, match="cannot hold 3 replicas"):
        emulated_hosts(Settings(cpu_hosts=((3, 2),)), 3)


def test_rank_invariants_hold_on_the_emulated_multi_host_world(tmp_path):
    r = run_cli("ranks", "--world-size", "2", "--json", str(tmp_path / "r.json"), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world size 2, 2 host(s)): ok" in r.stdout, r.stdout
    (check,) = json.loads((tmp_path / "r.json").read_text())["ranks"]
    assert sorted((int(b["host"]), b["bindings"]["local_ordinal"], b["bindings"]["global_ordinal"])
                  for b in check["reports"]) == \
        [(0, 0, 0), (1, 0, 1)], check


@pytest.mark.long
def test_a_ddp_dividing_by_the_local_world_size_fails_the_default_run(tmp_path):
    """Exact on one host (LOCAL_WORLD_SIZE == WORLD_SIZE), 2x off on the 2-host W=2 world."""
    r = run_cli("run", "--ddp", "tests.outside.local_world_divisor:LocalWorldDDP", "--only", "parity.linear",
                "--quiet", "--json", str(tmp_path / "r.json"), cwd=REPO, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    st = {(v["check"], v["world_size"]): v["status"] for v in json.loads((tmp_path / "r.json").read_text())["verdicts"]}
    assert st[("param_parity", 2)] == "fail" and st[("param_parity", 3)] == "pass", st
    os.remove(tmp_path / "r.json")
