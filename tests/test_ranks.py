"""Rank bindings: invariants across a live world, and consistency with torch.distributed."""
import pytest

from conformance.cases.invariant.kind import rank_invariant_violations, rank_report
from conformance.worlds.registry import WorldKey


@pytest.fixture(params=[pytest.param(w, marks=pytest.mark.cpu, id=f"cpu-w{w}") for w in (2, 3, 4)])
def cpu_world(request, world_pool):
    return world_pool.get(WorldKey("cpu", request.param))


def test_rank_invariants_cpu(cpu_world):
    reports = cpu_world.run(rank_report)
    w = cpu_world.world_size
    assert rank_invariant_violations([dict(r["bindings"], host=r["host"]) for r in reports], w) == []
    for ordinal, r in enumerate(reports):
        b = r["bindings"]
        assert r["module_api"] == b  # module functions agree with the snapshot
        assert b["global_ordinal"] == ordinal == r["ctx_rank"]
        # CPU runtime: one replica per process, so rank == process index == ordinal.
        assert r["dist"] == {"rank": b["process_index"], "world_size": b["process_count"]}
        assert b["process_index"] == b["global_ordinal"] and b["local_device_count"] == 1
    assert len({r["pid"] for r in reports}) == w


@pytest.mark.cpu
@pytest.mark.parametrize("case,problem", [
    ("dup_ordinal", "global ordinals"),
    ("gap_process", "process indices"),
    ("bad_local", "local ordinals"),
    ("bad_count", "local_device_count"),
])
def test_invariant_checker_catches(case, problem):
    good = [dict(process_index=r, process_count=2, global_ordinal=r, local_ordinal=r,
                 world_size=2, local_device_count=1) for r in range(2)]
    bad = [dict(b) for b in good]
    if case == "dup_ordinal":
        bad[1]["global_ordinal"] = 0
    elif case == "gap_process":
        bad[1]["process_index"] = 5
    elif case == "bad_local":
        bad[1]["local_ordinal"] = 0
    else:
        bad[0]["local_device_count"] = 2
    assert rank_invariant_violations(good, 2) == []
    assert any(problem in v for v in rank_invariant_violations(bad, 2))


@pytest.mark.cpu
def test_torch_bindings_from_launcher_env():
    from ddp_impl.runtime.ranks import torch_bindings
    b = torch_bindings({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (b.process_index, b.process_count, b.global_ordinal, b.local_ordinal, b.world_size,
            b.local_device_count) == (3, 4, 3, 1, 4, 1)
    with pytest.raises(ValueError, match="RANK=4"):
        torch_bindings({"RANK": "4", "WORLD_SIZE": "4"})
