"""The torch_xla shipped paths (conformance.impls.xla_paths) and the SPMD topology
(conformance.worlds.runtimes.pjrt_spmd). Unit tests need no torch_xla; tests marked
``pjrt`` skip with the runtime's reason where torch_xla 2.9 cannot run."""
from __future__ import annotations

import pytest

from conformance.cases.table import CASES
from conformance.evaluate import Session, evaluate
from conformance.impls.builtin import IMPLS
from conformance.worlds.runtimes import RuntimeUnavailable, WorldKey, get_runtime, world_key
from conformance.settings import Settings
from conformance.worlds.pool import WorldPool

SPMD_ROWS = ("xla_spmd", "xla_fsdpv2")


def test_world_key_maps_spmd_rows_to_one_program():
    own, spmd = world_key("pjrt", None, 4), world_key("pjrt", "spmd", 4)
    assert (own.world, own.replicas, own.where) == ("pjrt", 4, "pjrt")
    assert (spmd.world, spmd.replicas, spmd.where) == ("pjrt_spmd:4", 1, "pjrt:spmd")
    assert WorldKey.parse("pjrt_spmd:4") == spmd == WorldKey("pjrt", 4, "spmd")
    with pytest.raises(KeyError, match="unknown topology"):
        world_key("pjrt", "ring", 2)
    with pytest.raises(KeyError, match="unknown topology"):
        world_key("cpu", "spmd", 2)  # a topology is its runtime's
    with pytest.raises(KeyError, match="unknown runtime 'pjrt_ring:2'"):
        get_runtime("pjrt_ring:2")
    rt = get_runtime("pjrt_spmd:4")
    assert (rt.name, rt.devices) == ("pjrt_spmd", 4)
    assert get_runtime(spmd).devices == 4 and get_runtime(own).name == "pjrt"
    with pytest.raises(RuntimeUnavailable, match="world size 1"):
        rt.check(2)


def test_a_row_maps_only_a_runtime_with_topologies_to_one_of_them():
    """The runtime adapters' ``topologies`` decide; the messages are the ones of the former
    string test."""
    from dataclasses import replace

    from conformance.impls.builtin import strategy_problem
    row = IMPLS["xla_spmd"]
    assert strategy_problem(row) is None
    assert strategy_problem(replace(row, topology={"cpu": "spmd"})) == (
        "topology", "runtime 'cpu' has no topologies (only 'pjrt' does)")
    assert strategy_problem(replace(row, topology={"pjrt": "ring"})) == (
        "topology", "unknown topology 'ring'; known: spmd")


@pytest.mark.parametrize("name", SPMD_ROWS)
def test_spmd_rows_declare_their_semantics(name):
    row = IMPLS[name]
    assert row.topology == {"pjrt": "spmd"} and not row.holds_copies
    assert set(row.unsupported_kinds) == {"task", "property", "scenario"}
    assert "cpu" in row.unsupported and "pjrt" not in row.unsupported


def test_spmd_kwargs_refused():
    from conformance.impls.row import refuse_keywords
    from conformance.impls.xla_paths import SPMD_KWARGS
    refuse_keywords("xla_spmd", {"broadcast_buffers": True, "bucket_cap_mb": 1}, SPMD_KWARGS)
    with pytest.raises(TypeError, match="process_group"):
        refuse_keywords("xla_spmd", {"process_group": None}, SPMD_KWARGS)


def _pjrt(w):
    try:
        get_runtime("pjrt").check(w)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")


@pytest.fixture(scope="module")
def session():
    s = Session(WorldPool(Settings(replica_timeout=300)))
    yield s
    s.close()


@pytest.mark.pjrt
@pytest.mark.parametrize("name", SPMD_ROWS)
def test_spmd_row_matches_one_device(session, name):
    _pjrt(2)
    by = {v.check: v for v in evaluate(CASES["parity.mlp"], name, "pjrt", 2, session)}
    assert by["param_parity"].status == "pass" and by["param_parity"].world_size == 2, by["param_parity"]
    assert by["loss_parity"].status == "pass", by["loss_parity"]
    assert by["agreement"].status == "skip" and "no per-replica parameter copies" in by["agreement"].reason


@pytest.mark.pjrt
def test_spmd_row_refuses_local_batchnorm_and_per_replica_cases(session):
    _pjrt(2)
    bn = evaluate(CASES["parity.batchnorm"], "xla_spmd", "pjrt", 2, session)
    assert {v.status for v in bn} == {"unsupported"} and "global batch" in bn[0].reason
    task = evaluate(CASES["feature.no_sync"], "xla_spmd", "pjrt", 2, session)
    assert {v.status for v in task} == {"unsupported"} and "one program" in task[0].reason


def sharding_guard_task(ctx, shard: bool):
    """Forward+backward a Linear under SPMD, wrapped by the xla_spmd row or left
    unwrapped (one device's training), then apply the row's guard."""
    import torch

    from conformance.impls.xla_paths import _require_sharded, _wrap_spmd
    m = torch.nn.Linear(4, 2).to(ctx.device)
    model = _wrap_spmd(m, ctx, {}) if shard else m
    model(torch.randn(8, 4).to(ctx.device)).sum().backward()
    try:
        _require_sharded(model, None, ctx)
    except RuntimeError as exc:
        return str(exc)
    return "sharded"


@pytest.mark.pjrt
def test_sharding_guard_refuses_an_unsharded_step():
    """An SPMD step whose batch was never sharded trains one device's way and
    would pass parity: the rows' guard (after_backward) must refuse it."""
    from conformance.worlds.spawned import World
    _pjrt(2)
    with World("pjrt_spmd:2", 1, timeout=120) as world:
        assert world.run(sharding_guard_task, shard=True) == ["sharded"]
        [msg] = world.run(sharding_guard_task, shard=False)
    assert "not sharded" in msg, msg
