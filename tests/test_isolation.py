"""What one implementation leaves in a replica's process never becomes another's verdict
(conformance.worlds.isolation): each kind of the inventory is named and put back in process, and
from outside, one command runs DDPs that each leak one kind (tests/outside/leaks.py) with a
correct one, in both orders: the correct one passes, each leaking one fails its own transparency
verdict naming what it changed, and the order of ``--ddp`` changes no verdict."""
import json
import os

import pytest

from conformance.worlds import isolation
from tests.procs import run_cli

LEAKS = "tests.outside.leaks"
CONTROL = f"{LEAKS}:Control"
# leaking class -> (runtimes it leaks on, what its failing transparency verdict names, by runtime)
NAMED = {
    "InitsProcessGroup": {"pjrt": "torch.distributed initialised (backend xla, rank 0, world_size 1)"},
    "SetsLauncherEnv": {rt: "environment variable MASTER_ADDR set to '127.0.0.1'" for rt in ("cpu", "pjrt")},
    "WrapsAllReduce": {rt: "torch.distributed.all_reduce replaced" for rt in ("cpu", "pjrt")},
    "PatchesLinear": {rt: "torch.nn.functional.linear replaced" for rt in ("cpu", "pjrt")},
    "GlobalForwardHook": {rt: "hook(s) registered in torch.nn.modules.module._global_forward_hooks"
                          for rt in ("cpu", "pjrt")},
    "LeavesAutocast": {rt: f"autocast on {'xla' if rt == 'pjrt' else 'cpu'} is on (bfloat16) (was off)"
                       for rt in ("cpu", "pjrt")},
    "RegistersBackend": {"cpu": "torch.distributed backend 'counting_gloo' registered"},
}
# the measurement: the rank invariant reads torch.distributed, which a PJRT DDP initialised
ONLY = {"cpu": "parity.linear", "pjrt": "parity.linear,invariant"}
RUN_TIMEOUT_S = 900


@pytest.fixture
def snapshot():
    """Takes a snapshot of this process when called (in the test's body: pytest rewrites
    ``PYTEST_CURRENT_TEST`` between its phases); puts it back and drops it after the test."""
    yield isolation.take_snapshot
    isolation.restore("process")
    isolation.restore("thread")
    isolation._SNAPSHOT.clear()


def _leak_and_restore(leak, says):
    leak()
    got = isolation.changes()
    assert any(says in c for c in got), got
    restored = isolation.restore("process")["restored"] + isolation.restore("thread")["restored"]
    assert got == restored and isolation.changes() == [], (got, restored, isolation.changes())


def test_nothing_changed_is_no_change(snapshot):
    snapshot()
    assert isolation.changes() == []
    assert isolation.restore("process") == {"restored": [], "fresh": []}


def test_each_kind_is_named_and_put_back(snapshot):
    snapshot()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    original = dist.all_reduce
    _leak_and_restore(lambda: os.environ.__setitem__("MASTER_PORT", "29500"),
                      "environment variable MASTER_PORT set to '29500'")
    _leak_and_restore(lambda: setattr(dist, "all_reduce", lambda *a, **k: None),
                      "torch.distributed.all_reduce replaced")
    assert dist.all_reduce is original
    _leak_and_restore(lambda: setattr(F, "linear", lambda *a: None), "torch.nn.functional.linear replaced")
    _leak_and_restore(lambda: torch.nn.modules.module.register_module_forward_hook(lambda *a: None),
                      "1 hook(s) registered in torch.nn.modules.module._global_forward_hooks")
    _leak_and_restore(lambda: torch.set_autocast_enabled("cpu", True), "autocast on cpu is on (bfloat16) (was off)")
    assert not torch.is_autocast_enabled("cpu")
    _leak_and_restore(lambda: dist.Backend.register_backend("leak_probe", lambda *a: None, devices=["cpu"]),
                      "torch.distributed backend 'leak_probe' registered")
    assert "leak_probe" not in dist.Backend.backend_list and not hasattr(dist.Backend, "LEAK_PROBE")
    dist.Backend.register_backend("leak_probe", lambda *a: None, devices=["cpu"])  # registrable again
    isolation.restore("process")


def test_a_group_initialised_is_destroyed(snapshot):
    snapshot()
    import torch.distributed as dist
    _leak_and_restore(lambda: dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1),
                      "torch.distributed initialised (backend gloo, rank 0, world_size 1)")
    assert not dist.is_initialized()


def test_a_change_that_cannot_be_put_back_asks_for_a_fresh_world(snapshot):
    snapshot()
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        isolation.take_snapshot()  # a world whose own group is then destroyed by a DDP
        dist.destroy_process_group()
        assert isolation.changes() == ["torch.distributed's default group destroyed"]
        got = isolation.restore("process")
        assert got["restored"] == [] and len(got["fresh"]) == 1 and "new world" in got["fresh"][0], got
    finally:
        isolation._SNAPSHOT.clear()


def test_a_world_reset_is_the_kits_change_not_an_implementations(snapshot):
    """A replica's raise resets the world (conformance.worlds.host.reset_host): its new default
    group is recorded again, so the next implementation's case is not told it replaced it."""
    snapshot()
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        isolation.take_snapshot()
        dist.destroy_process_group()  # what reset_host does: a new rendezvous
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        assert isolation.changes()[0].startswith("torch.distributed's default group replaced")
        isolation.retake(isolation.GROUP_ITEM)
        assert isolation.changes() == []
        with pytest.raises(KeyError):
            isolation.retake("no such item")
    finally:
        dist.destroy_process_group()
        isolation._SNAPSHOT.clear()


def test_the_generators_are_put_back_not_judged(snapshot):
    snapshot()
    import torch
    before = torch.get_rng_state()
    torch.rand(3)
    assert isolation.changes() == []
    isolation.restore("process")
    assert torch.equal(torch.get_rng_state(), before)


def _verdicts(runtime: str, ddps: list[str], tmp_path, tag: str) -> dict:
    out = tmp_path / f"{runtime}-{tag}.json"
    r = run_cli("run", "--runtime", runtime, "--world-size", "2", "--ddp", ",".join(ddps), "--only", ONLY[runtime],
                "--lanes", "1", "--quiet", "--json", str(out), timeout=RUN_TIMEOUT_S)
    assert out.exists(), r.stderr[-3000:]
    doc = json.loads(out.read_text())
    return {(v["impl"], v["case"], v["check"]): v for v in doc["verdicts"]}, r


@pytest.mark.long
@pytest.mark.parametrize("runtime", [pytest.param("cpu", marks=pytest.mark.cpu),
                                     pytest.param("pjrt", marks=pytest.mark.pjrt)])
def test_leaking_ddps_fail_their_own_case_and_the_correct_one_passes_in_either_order(runtime, tmp_path):
    if runtime == "pjrt":
        pytest.importorskip("torch_xla", reason="the PJRT runtime needs torch_xla")
    leaking = [f"{LEAKS}:{name}" for name, says in NAMED.items() if runtime in says]
    first, r1 = _verdicts(runtime, leaking + [CONTROL], tmp_path, "control-last")
    second, r2 = _verdicts(runtime, [CONTROL] + leaking[::-1], tmp_path, "control-first")
    assert r1.returncode == r2.returncode == 1, (r1.stderr[-2000:], r2.stderr[-2000:])
    assert "started anew" not in r1.stderr + r2.stderr  # every kind was put back in place
    for got in (first, second):
        control = {k: v["status"] for k, v in got.items() if k[0] == CONTROL}
        assert control and set(control.values()) == {"pass"}, control
        for spec in leaking:
            says = NAMED[spec.rpartition(":")[2]][runtime]
            v = got[(spec, "parity.linear", "transparency")]
            assert v["status"] == "fail" and says in v["reason"] + (v.get("diagnosis") or ""), (spec, v["reason"])
            others = [n for n in NAMED.values() if runtime in n and n[runtime] != says]
            assert not any(o[runtime] in v["reason"] + (v.get("diagnosis") or "") for o in others), v["reason"]
    assert {k: v["status"] for k, v in first.items()} == {k: v["status"] for k, v in second.items()}
