"""Where every distinct graph is compiled (XLA), generated examples draw their shapes from a
few that repeat (docs/runtimes/pjrt.md; benchmarks/README.md, session 6), and keep varying."""
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from conformance.cases.properties import gradsync as P
from conformance.cases.scenarios import scenario as S
from conformance.worlds.runtimes import get_runtime

pytestmark = pytest.mark.cpu


def _draw(strategy, n=80):
    seen = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(ex=strategy)
    def collect(ex):
        seen.append(ex)
    collect()
    return seen


def test_only_xla_runtimes_compile_per_graph():
    assert get_runtime("pjrt").compiled_graphs and get_runtime("xrt").compiled_graphs
    assert not get_runtime("cpu").compiled_graphs


def test_property_examples_draw_from_the_few_shapes():
    few = _draw(P.mlp_examples(2, few_shapes=True))
    assert {e.widths for e in few} <= set(P.FEW_MLP_WIDTHS)
    assert {e.local_batch for e in few} <= set(P.FEW_LOCAL_BATCHES)
    assert len({(e.widths, e.local_batch) for e in few}) >= 6  # still several architectures
    full = _draw(P.mlp_examples(2))
    assert len({e.widths for e in full}) > len(P.FEW_MLP_WIDTHS)  # the CPU draw is unchanged
    assert {e.widths for e in _draw(P.bn_examples(2, few_shapes=True))} <= set(P.FEW_BN_WIDTHS)


def test_scenarios_draw_few_batch_sizes():
    space = replace(S.Space(), rank_uniform=True, few_shapes=True)
    batches = {b for sc in _draw(S.scenarios(2, space), 40) for st in sc.steps for m in st["micro"]
               for b in m["batch"]}
    assert batches and batches <= set(S.FEW_BATCHES)
