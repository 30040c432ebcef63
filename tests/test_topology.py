"""The topology generator (conformance.cases.scenario.topology): its format's errors, a
reproducible draw that reaches every corner in many graph shapes, shrinking to the smallest graph,
the module built the same from a seed, and the oracle on a topology scenario."""
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, find, settings

from conformance.cases.scenario.dimensions import prediction_of
from conformance.cases.scenario.format import Scenario, ScenarioError
from conformance.cases.scenario.generate import Space, scenario_tolerance, scenarios, space_problem
from conformance.cases.scenario.oracle import scenario_reference
from conformance.cases.scenario.topology import (TopologyError, build_topology, corners, needs, topologies,
                                                 validate_topology)
from conformance.cases.scenario.topology.spec import node
from tests.draws import draw_examples

pytestmark = pytest.mark.cpu

PLAIN = {"base": "float32", "inputs": 1, "nodes": [node("stem", ["x0"]), node("linear", [0])], "outputs": [1],
         "root_param": False, "none_input": False, "returns": "tensor", "head": "once"}
#: Every corner the generator places (spec.corners' phrases, without the merge kind and layer names).
CORNERS = ("float64 model", "two inputs", "several outputs", "merge", "gated node", "float64 layer",
           "bfloat16 layer", "complex64 layer", "transposed weight", "channels_last weight",
           "sparse gradient (embedding)", "sparse gradient (embedding_bag)", "applied twice",
           "applied checkpoint nonreentrant", "applied checkpoint reentrant", "module reused", "tied weight",
           "frozen layer", "parameter on the root", "positional None input", "nested 5 levels deep",
           "levels deep (buffers)", "parameter on a block with children", "weights read by the parent",
           "None parameter slot first", "parameters viewing one storage", "lazy layer",
           "predictions returned in a dict", "predictions returned in a dataclass",
           "predictions returned in a namedtuple", "predictions returned in a model_output",
           "heads applied under checkpoint nonreentrant",
           "heads applied under checkpoint reentrant")


def _with(t, i, **kw):
    t = json.loads(json.dumps(t))
    t["nodes"][i].update(kw)
    return t


@pytest.mark.parametrize("bad, needle", [
    (dict(PLAIN, base="float16"), "base 'float16'"),
    (dict(PLAIN, inputs=3), "inputs 3"),
    (dict(PLAIN, nodes=[]), "nodes: a list of 1..12"),
    (_with(PLAIN, 1, op="resnet"), "op 'resnet'"),
    (_with(PLAIN, 1, src=[1]), "source 1"),
    (_with(PLAIN, 0, src=["idx"]), "stem reads one dense input"),
    (_with(PLAIN, 1, dtype="complex64", op="lstm"), "dtype 'complex64'"),
    (_with(PLAIN, 1, layout="channels_last"), "layout 'channels_last'"),
    (_with(PLAIN, 1, sparse=True), "sparse: true only"),
    (_with(PLAIN, 1, apply="checkpoint_reentrant", op="batchnorm"), "not checkpointed"),
    (_with(PLAIN, 1, reuse=0), "a node of the same op"),
    (dict(PLAIN, outputs=[0]), "read by no node"),
    (dict(PLAIN, outputs=[5]), r"outputs \[5\]"),
    (dict(PLAIN, none_input=True), "none_input: only with 2 inputs"),
    (_with(PLAIN, 1, depth=4), "depth 4"),
    (_with(PLAIN, 1, own=True), "own: true or false"),
    (_with(PLAIN, 1, form="fused", op="gru"), "form 'fused'"),
    (dict(PLAIN, returns="list"), "returns 'list'"),
    (dict(PLAIN, head="twice"), "head 'twice'"),
    (dict(_with(_with(PLAIN, 0, frozen=True), 1, frozen=True), head="checkpoint_reentrant"), "no gradient"),
])
def test_a_bad_topology_is_one_line(bad, needle):
    with pytest.raises(TopologyError, match=needle) as exc:
        validate_topology(bad)
    assert "\n" not in str(exc.value)


def test_a_scenario_file_holds_a_topology_and_its_needs_are_checked():
    sc = draw_examples(scenarios(2, Space(topology=True, ddp_extra=("static_graph",))), 30)
    sc = next(s for s in sc if needs(s.topology)["reentrant"])
    d = json.loads(json.dumps(sc.to_json()))
    assert Scenario.from_json(d).topology == sc.topology
    with pytest.raises(ScenarioError, match="needs DDP static_graph"):
        Scenario.from_json(dict(d, ddp=dict(d["ddp"], static_graph=False)))
    with pytest.raises(ScenarioError, match="topology node 0"):
        Scenario.from_json(dict(d, topology=_with(d["topology"], 0, op="nope")))
    assert space_problem({"topology": True, "max_nodes": 0}).startswith("max_nodes 0")


def test_the_draw_is_reproducible_and_reaches_every_corner_in_many_shapes():
    a, b = draw_examples(topologies(), 300), draw_examples(topologies(), 300)
    assert a == b
    for t in a:
        validate_topology(t)
    for corner in CORNERS:
        holding = [t for t in a if any(corner in c for c in corners(t))]
        shapes = {json.dumps([(nd["op"], nd["src"]) for nd in t["nodes"]]) for t in holding}
        assert len(shapes) >= 3, (corner, len(holding))


def test_a_failing_topology_shrinks_to_the_smallest_graph():
    # "fails": any LSTM downstream of a sparse embedding; the smallest such graph is three nodes
    def fails(t):
        sparse = {i for i, nd in enumerate(t["nodes"]) if nd["sparse"]}
        return any(nd["op"] == "lstm" and sparse & set(nd["src"]) for nd in t["nodes"])
    t = find(topologies(), fails, settings=settings(database=None, max_examples=2000, derandomize=True,
                                                    suppress_health_check=list(HealthCheck)))
    assert [nd["op"] for nd in t["nodes"]] in (["stem", "embedding", "lstm"], ["stem", "embedding_bag", "lstm"])
    assert corners(t) == ["sparse gradient (" + t["nodes"][1]["op"] + ")"] or len(t["nodes"][2]["src"]) == 1


def test_the_module_is_the_same_from_a_seed_and_trains_every_node():
    for t in draw_examples(topologies(), 40):
        a, b, c = (build_topology(t, s, False) for s in (5, 5, 6))
        pa = [p.detach() for p in a.parameters()]
        assert all(torch.equal(p, q) for p, q in zip(pa, b.parameters()))
        assert any(not torch.equal(p, q) for p, q in zip(pa, c.parameters()))
        xs = [torch.randn(3, 8) for _ in range(t["inputs"])]
        if t["none_input"]:  # forward(x0, mask=None, x1=None) called with a positional None
            xs = [xs[0], None, xs[1]]
        prediction_of(a(*xs, idx=torch.randint(0, 16, (3, 2)))).sum().backward()
        assert not any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in a.parameters())
        if t["root_param"]:
            assert a.logit_scale.grad is not None
        assert all(p.grad is not None for p in a.heads.parameters())
        for i, nd in enumerate(t["nodes"]):  # a fused weight's three parameters view one storage
            if nd["form"] == "fused" and nd["reuse"] is None:
                q, k, v = (getattr(a.layers[str(i)].get_submodule(".".join(["inner"] * nd["depth"]) or ""), n)
                           for n in "qkv")
                assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
        for i, nd in enumerate(t["nodes"]):  # every own, trainable layer is reached with the full plan
            if nd["reuse"] is None and not nd["frozen"]:
                assert any(p.grad is not None for p in a.layers[str(i)].parameters()), (i, nd)


def test_the_oracle_runs_a_topology_scenario_in_its_tolerance():
    for sc in draw_examples(scenarios(2, Space(topology=True, ddp_extra=("buckets", "static_graph"))), 6):
        ref = scenario_reference(sc)
        assert ref["params"].shape[0] == len(sc.steps) + 1 and np.isfinite(ref["params"]).all()
        assert scenario_tolerance("cpu", sc).atol > 0
