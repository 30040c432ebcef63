"""Emulated hosts: a world's replicas grouped into H hosts, so faults that need two hosts are
expressible (a divisor or shard index taken from the local world). The default W=2 world is 2
hosts x 1 on both runtimes. CPU: the launcher variables torchrun gives a multi-node job. PJRT
(one process x W replica threads): torch_xla's per-host queries answer per emulated host
(conformance.worlds.runtimes.pjrt_hosts)."""
import ast
import importlib.util
import json
import os
import threading

import pytest

from conformance.cases.invariant.kind import check_reports, rank_report
from conformance.cases.table import CASES
from conformance.errors import UsageError
from conformance.evaluate import evaluate
from conformance.settings import Settings, emulated_hosts
from conformance.verdict import BAD
from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime, pjrt_hosts
from conformance.worlds.runtimes.pjrt_hosts import HostLayout
from conformance.worlds.spawned import World

from .procs import REPO, run_cli


def _layout(envs):
    return [(e["RANK"], e["GROUP_RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) for e in envs]


@pytest.mark.cpu
def test_torchrun_layout_of_emulated_hosts():
    from conformance.worlds.launchers import LAUNCHERS
    torchrun = LAUNCHERS["torchrun"].env
    assert _layout(get_runtime("cpu", Settings()).host_envs(2)) == [("0", "0", "0", "1", "2"),
                                                                   ("1", "1", "0", "1", "2")]  # 2 hosts x 1
    assert _layout([torchrun(r, 3, 1) for r in range(3)]) == [(str(r), "0", str(r), "3", "1") for r in range(3)]
    assert _layout([torchrun(r, 4, 2) for r in range(4)]) == [("0", "0", "0", "2", "2"), ("1", "0", "1", "2", "2"),
                                                              ("2", "1", "0", "2", "2"), ("3", "1", "1", "2", "2")]
    with pytest.raises(UsageError, match="cannot hold 3 replicas"):
        emulated_hosts(Settings(cpu_hosts=((3, 2),)), 3)


@pytest.mark.cpu
def test_each_default_world_is_started_as_its_launcher_would():
    """W=2 gets torchrun's variables, W=3 those of a PyTorchJob pod whose script spawns the
    replicas (WORLD_SIZE counts pods, RANK is the pod's index: they disagree with the group),
    W=4 srun's, W=7 plain mp.spawn's (none: rank and world size are arguments), each as the
    launcher sets them (docs/worlds.md)."""
    from conformance.worlds.host import SCRUBBED_LAUNCHER_VARS
    from conformance.worlds.launchers import coverage_line
    cpu = get_runtime("cpu", Settings())
    three = cpu.host_envs(3)
    assert [(e["WORLD_SIZE"], e["RANK"]) for e in three] == [("1", "0")] * 3 and all("LOCAL_RANK" not in e
                                                                                   for e in three), three
    seven = cpu.host_envs(7)
    assert all("RANK" not in e and "WORLD_SIZE" not in e and "LOCAL_RANK" not in e for e in seven), seven
    slurm = cpu.host_envs(4)
    assert [e["SLURM_PROCID"] for e in slurm] == ["0", "1", "2", "3"] and all("RANK" not in e for e in slurm)
    assert {k for e in three + slurm + seven for k in e} - {"OMP_NUM_THREADS"} <= set(SCRUBBED_LAUNCHER_VARS)
    assert coverage_line({2, 3}).startswith("coverage worlds: launchers torchrun (W=2), pod_spawn (W=3); not drawn: slurm")
    assert "mp_spawn (--world-size 7)" in coverage_line({2, 3})


@pytest.mark.cpu
def test_rank_invariants_hold_on_the_emulated_multi_host_world(tmp_path):
    r = run_cli("ranks", "--world-size", "2", "--json", str(tmp_path / "r.json"), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world size 2, 2 host(s)): ok" in r.stdout, r.stdout
    (check,) = json.loads((tmp_path / "r.json").read_text())["ranks"]
    assert sorted((int(b["host"]), b["bindings"]["local_ordinal"], b["bindings"]["global_ordinal"])
                  for b in check["reports"]) == \
        [(0, 0, 0), (1, 0, 1)], check


@pytest.mark.cpu
@pytest.mark.long
def test_a_ddp_dividing_by_the_local_world_size_fails_the_default_run(tmp_path):
    """Exact on one host (LOCAL_WORLD_SIZE == WORLD_SIZE), 2x off on the 2-host W=2 world."""
    r = run_cli("run", "--ddp", "tests.outside.local_world_divisor:LocalWorldDDP", "--only", "parity.linear",
                "--quiet", "--json", str(tmp_path / "r.json"), cwd=REPO, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    st = {(v["check"], v["world_size"]): v["status"] for v in json.loads((tmp_path / "r.json").read_text())["verdicts"]}
    assert st[("param_parity", 2)] == "fail" and st[("param_parity", 3)] == "pass", st
    os.remove(tmp_path / "r.json")


# --- PJRT ---------------------------------------------------------------------------------

@pytest.mark.cpu
def test_pjrt_host_layouts():
    assert [emulated_hosts(Settings(), w, "pjrt") for w in (2, 3, 4, 8)] == [2, 1, 2, 1]
    assert emulated_hosts(Settings(), 2, "xrt") == 1  # no emulation there
    assert [HostLayout.of(o, 4, 2) for o in range(4)] == [
        HostLayout(0, 2, 0, 2), HostLayout(0, 2, 1, 2), HostLayout(1, 2, 0, 2), HostLayout(1, 2, 1, 2)]
    assert HostLayout.of(2, 3, 1) == HostLayout(0, 1, 2, 3)
    with pytest.raises(ValueError):
        HostLayout.of(0, 3, 2)
    with pytest.raises(UsageError, match="cannot hold 3 replicas"):
        emulated_hosts(Settings(pjrt_hosts=((3, 2),)), 3, "pjrt")


def _pjrt(w):
    try:
        get_runtime("pjrt").check(w)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")


def _query_call_sites(root):
    """(module, calling function) of every call of a query name inside the torch_xla package:
    ``f()`` in the defining module or ``xr./runtime./xm./torch_xla.f()``."""
    names = {name for _, name in pjrt_hosts.QUERIES}
    sites = set()
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            mod = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
            mod = mod[:-len(".__init__")] if mod.endswith(".__init__") else mod
            with open(path) as fh:
                tree = ast.parse(fh.read())

            def visit(node, fn, mod=mod):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        visit(child, child.name)
                        continue
                    if isinstance(child, ast.Call):
                        fu = child.func
                        if isinstance(fu, ast.Name) and fu.id in names:
                            sites.add((mod, fn))
                        elif isinstance(fu, ast.Attribute) and fu.attr in names:
                            base = fu.value.id if isinstance(fu.value, ast.Name) else getattr(fu.value, "attr", None)
                            if base in ("xr", "runtime", "xm", "torch_xla"):
                                sites.add((mod, fn))
                    visit(child, fn)
            visit(tree, "<module>")
    return sites


@pytest.mark.pjrt
def test_every_torch_xla_call_site_of_an_emulated_query_is_decided():
    """A torch_xla caller not in pjrt_hosts.CALLERS would silently get the emulated answer."""
    _pjrt(2)
    root = os.path.dirname(importlib.util.find_spec("torch_xla").origin)
    sites = _query_call_sites(root)
    assert ("torch_xla._internal.rendezvous", "pjrt_rendezvous_handler") in sites  # the scan sees calls
    assert sites - set(pjrt_hosts.CALLERS) == set()


_BARRIERS: dict = {}


def queries_task(ctx):
    """Every emulated query from user code; the real answers for torch_xla's process-wide cache
    and for torch.distributed's group; a global all-reduce."""
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    from ddp_impl.runtime.xla import init_pjrt_process_group
    barrier = _BARRIERS.setdefault(ctx.world_size, threading.Barrier(ctx.world_size))
    got = {"process_index": xr.process_index(), "process_count": xr.process_count(),
           "host_index": xr.host_index(), "addressable_device_count": xr.addressable_device_count(),
           "local_device_count": xr.local_device_count(), "device_count": torch_xla.device_count(),
           "local_ordinal": xr.local_ordinal(), "get_local_ordinal": xm.get_local_ordinal(),
           "is_master_ordinal": xm.is_master_ordinal(), "is_global_master": xm.is_master_ordinal(local=False),
           "world_size": xr.world_size(), "global_ordinal": xr.global_ordinal()}
    # torch_xla's thread-per-device start calls _init_world_size_ordinal before any world_size();
    # with one (emulated) device per process it would cache the first thread's ordinal for all.
    barrier.wait(30)
    if ctx.rank == 0:
        xr._WORLD_SIZE = xr._ORDINAL = None
    barrier.wait(30)
    xr._init_world_size_ordinal()
    barrier.wait(30)
    got["ordinal_after_cache"] = xr.global_ordinal()
    got["world_after_cache"] = xr.world_size()
    init_pjrt_process_group()
    import torch.distributed as dist
    got["dist"] = (dist.get_rank(), dist.get_world_size())
    t = xm.all_reduce(xm.REDUCE_SUM, torch.ones(1).to(ctx.device))
    ctx.mark_step()
    got["all_reduce"] = t.cpu().item()
    return got


@pytest.mark.pjrt
@pytest.mark.long
@pytest.mark.parametrize("w,hosts", [(4, 2), (2, 2)], ids=["w4-2x2", "w2-2x1"])
def test_torch_xla_queries_answer_per_emulated_host(w, hosts):
    """The per-host queries, the rank invariants, and the parts that stay real; 2 x 1 (one device
    per emulated process) is where torch_xla's process-wide ordinal cache would bite."""
    _pjrt(w)
    with World("pjrt", w, timeout=120, settings=Settings(pjrt_hosts=((w, hosts),))) as world:
        reports = world.run(rank_report)
        got = world.run(queries_task)
    assert check_reports(reports, w) == []
    per_host = w // hosts
    assert [r["host"] for r in reports] == [str(o // per_host) for o in range(w)]
    for o, g in enumerate(got):
        h, local = divmod(o, per_host)
        assert g == {"process_index": h, "process_count": hosts, "host_index": h,
                     "addressable_device_count": per_host, "local_device_count": per_host,
                     "device_count": per_host, "local_ordinal": local, "get_local_ordinal": local,
                     "is_master_ordinal": local == 0, "is_global_master": o == 0, "world_size": w,
                     "global_ordinal": o, "ordinal_after_cache": o, "world_after_cache": w,
                     "dist": (0, 1), "all_reduce": float(w)}, (o, g)


@pytest.mark.pjrt
@pytest.mark.long
def test_rank_invariants_run_on_the_emulated_pjrt_world(tmp_path):
    """The CLI's default W=4 PJRT world: 2 hosts x 2."""
    _pjrt(4)
    r = run_cli("ranks", "--runtime", "pjrt", "--world-size", "4", "--json", str(tmp_path / "r.json"),
                cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(pjrt, world size 4, 2 host(s)): ok" in r.stdout, r.stdout
    (check,) = json.loads((tmp_path / "r.json").read_text())["ranks"]
    assert [(b["host"], b["bindings"]["local_ordinal"], b["bindings"]["process_count"]) for b in check["reports"]] \
        == [("0", 0, 2), ("0", 1, 2), ("1", 0, 2), ("1", 1, 2)], check


XLA_DDPS = "tests.outside.xla_local_divisor"


@pytest.mark.pjrt
@pytest.mark.parametrize("w", [2, 3])
def test_an_xla_ddp_dividing_by_the_addressable_device_count_fails_on_two_hosts(w, conformance_session):
    """Exact on one host (W=3 as 1 x 3), 2x off on the 2-host W=2 world; its twin dividing by
    xr.world_size() passes both."""
    _pjrt(w)
    case = CASES["parity.linear"]
    faulty = evaluate(case, f"{XLA_DDPS}:XlaLocalDivisorDDP", "pjrt", w, conformance_session, shrink=False)
    correct = evaluate(case, f"{XLA_DDPS}:XlaHookDDP", "pjrt", w, conformance_session, shrink=False)
    assert [v.status for v in correct] == ["pass"] * len(correct), [(v.check, v.status, v.reason) for v in correct]
    bad = {v.check for v in faulty if v.status in BAD}
    assert (bad >= {"param_parity", "loss_parity"}) if w == 2 else not bad, [(v.check, v.status) for v in faulty]
