"""The DDP surface map (conformance.cases.surface) against the installed torch, and the bucket
caps drawn at the model's boundaries (conformance.cases.scenario.buckets)."""
import pathlib

import pytest
from hypothesis import given, settings, strategies as st

from conformance.cases.scenario.buckets import CAP_CLASSES, MIB, cap_bytes, cap_mb, exactly_full, grad_bytes, \
    greedy_buckets
from conformance.cases.scenario.generate import Space, scenarios
from conformance.cases.scenario.model import build_scenario_model
from conformance.cases.surface import SURFACE, render, torch_surface
from conformance.cases.table import CASES

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "transparency.md"


def test_every_keyword_and_method_of_torchs_ddp_has_a_row():
    """Fails when torch grows a keyword or method the map does not know."""
    torch_names = torch_surface()
    assert sorted(n for n in torch_names if n not in SURFACE) == []
    assert {n: SURFACE[n].kind for n in torch_names} == torch_names


def test_no_row_names_what_torch_no_longer_has():
    assert sorted(n for n in SURFACE if n not in torch_surface()) == []


def test_every_covering_case_exists_and_every_gap_has_a_reason():
    assert sorted(c for cell in SURFACE.values() for c in cell.covered if c not in CASES) == []
    assert [c.name for c in SURFACE.values() if not c.covered and not c.reason] == []


def test_the_published_map_is_the_table():
    assert render() in DOC.read_text()


@given(st.lists(st.integers(1, 256), min_size=1, max_size=8), st.integers(2, 6))
def test_each_cap_class_gives_the_bucketing_it_names(sizes, k):
    total = sum(sizes)
    assert greedy_buckets(sizes, cap_bytes(sizes, "above_model")) == [list(range(len(sizes)))]
    assert exactly_full(sizes, cap_bytes(sizes, "model_exactly")) >= 1
    assert len(greedy_buckets(sizes, cap_bytes(sizes, "below_smallest"))) == len(sizes)
    assert greedy_buckets(sizes, cap_bytes(sizes, "one_parameter"))[0] == [0]
    first = greedy_buckets(sizes, cap_bytes(sizes, "fills_one", k))[0]
    assert first == list(range(min(k, len(sizes))))
    several = cap_bytes(sizes, "fills_several")
    assert exactly_full(sizes, several) == max(exactly_full(sizes, c) for c in range(1, total + 1))
    for cls in CAP_CLASSES:  # MiB and back is exact: the DDP's int(cap * 2**20) is the drawn byte count
        assert int(cap_mb(sizes, cls, k) * MIB) == cap_bytes(sizes, cls, k)


def test_the_scenario_model_has_a_cap_that_fills_several_buckets_exactly():
    sizes = grad_bytes(build_scenario_model(0, False))
    assert exactly_full(sizes, cap_bytes(sizes, "fills_several")) >= 2


@settings(max_examples=40, deadline=None)
@given(sc=scenarios(2, Space(ddp_extra=("buckets",))))
def test_a_drawn_bucket_cap_is_one_of_the_models_boundaries(sc):
    sizes = grad_bytes(build_scenario_model(sc.seed, sc.rebind_buffers, 0.0, sc.workload, sc.module))
    caps = {cap_bytes(sizes, c, k) for c in CAP_CLASSES for k in range(2, 7)}
    assert int(sc.ddp["bucket_cap_mb"] * MIB) in caps


@pytest.mark.filterwarnings("ignore:.*broadcast_buffers:FutureWarning")
def test_the_oracles_buffer_sync_is_torchs_constructor(monkeypatch):
    """format.buffer_sync against torch's own DDP.__init__ on a one-rank gloo group: the
    construction sync it asks for (recorded) and the forward sync it keeps."""
    import itertools
    import tempfile

    import torch
    import torch.distributed as dist
    import torch.nn.parallel.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel

    from conformance.cases.scenario.format import buffer_sync
    seen = []
    monkeypatch.setattr(tdist, "_sync_module_states",
                        lambda **kw: seen.append(kw["broadcast_buffers"]))
    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
        try:
            for bcast, fwd, init in itertools.product((True, None, False), (None, True, False), (True, False)):
                seen.clear()
                ddp = DistributedDataParallel(torch.nn.Linear(2, 2), broadcast_buffers=bcast,
                                              forward_sync_buffers=fwd, init_sync=init)
                want = buffer_sync({"broadcast_buffers": bcast, "forward_sync_buffers": fwd, "init_sync": init})
                assert (bool(seen and seen[0]), ddp.forward_sync_buffers) == want, (bcast, fwd, init)
                assert bool(seen) == init
        finally:
            dist.destroy_process_group()


@settings(max_examples=60, deadline=None)
@given(sc=scenarios(2, Space(ddp_extra=("keywords",), loop=True)))
def test_a_drawn_keyword_scenario_is_valid_and_its_caps_are_the_models_boundaries(sc):
    sc.validate()
    caps = sc.ddp.get("bucket_cap_mb_list")
    if caps:
        sizes = grad_bytes(build_scenario_model(sc.seed, sc.rebind_buffers, 0.0, sc.workload, sc.module))
        assert all(any(c == cap_mb(sizes, cls, k) for cls in CAP_CLASSES for k in range(2, 7)) for c in caps)


def test_the_keyword_case_holds_every_value_class_explicitly():
    from conformance.cases.scenario.explicit import explicit_scenarios
    from conformance.cases.scenario.generate import KEYWORD_VALUES
    explicit = explicit_scenarios(2, Space(ddp_extra=("keywords",), loop=True))
    for k, values in KEYWORD_VALUES.items():
        held = {e.ddp.get(k, True if k == "init_sync" else None if k.endswith("buffers") else False)
                for e in explicit}
        assert set(values) <= held, (k, held)
    assert any(e.ddp.get("bucket_cap_mb_list") for e in explicit)
    assert any(e.ddp.get("skip_all_reduce_unused_params") for e in explicit)
