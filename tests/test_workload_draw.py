"""The drawn workload of the generated scenarios (scenario.workload, issue 18): its data,
what is never drawn, the explicit scenarios' coverage, and the oracle on the corners."""
import json

import numpy as np
import pytest

from conformance.cases.scenario.dimensions import BRANCHES, PLAIN_WORKLOAD, VOCAB, WORKLOADS, xla_unsupported
from conformance.cases.scenario.explicit import explicit_scenarios
from conformance.cases.scenario.format import Scenario, ScenarioError
from conformance.cases.scenario.generate import Space, scenario_tolerance, scenarios
from conformance.cases.scenario.model import build_scenario_model, scenario_batch, scenario_indices
from conformance.cases.scenario.oracle import scenario_reference
from tests.draws import draw_examples

pytestmark = pytest.mark.cpu

SPACE = Space(workload=True, ddp_extra=("buckets", "static_graph"))


def _draw(strategy, n=150):
    return draw_examples(strategy, n)


def test_a_file_without_a_workload_is_the_plain_one_and_bad_workloads_are_one_line_errors():
    sc = explicit_scenarios(2, Space())[1]
    old = sc.to_json()
    del old["workload"]
    assert Scenario.from_json(old).workload == PLAIN_WORKLOAD
    wl = explicit_scenarios(2, SPACE)[0].to_json()
    assert Scenario.from_json(json.loads(json.dumps(wl))).workload["graph"] == "checkpoint_reentrant"
    bad = [(dict(wl, workload=dict(wl["workload"], dtype="float8")), "workload dtype"),
           (dict(wl, ddp=dict(wl["ddp"], static_graph=False)), "needs DDP static_graph"),
           (dict(old, optimizer="adam", workload=dict(PLAIN_WORKLOAD, grad="sparse")), "sparse gradients need"),
           (dict(old, ddp=dict(old["ddp"], static_graph=True)), "same plan")]
    for d, needle in bad:
        with pytest.raises(ScenarioError, match=needle):
            Scenario.from_json(d)


def test_explicit_workload_scenarios_cover_every_corner_and_on_xla_only_its_corners():
    for w in (2, 3):
        seen = {(k, e.workload[k]) for e in explicit_scenarios(w, SPACE) for k in WORKLOADS}
        assert seen == {(k, v) for k, vs in WORKLOADS.items() for v in vs[1:]} | {
            (k, v) for k, v in seen if v == PLAIN_WORKLOAD[k]}
        xla = explicit_scenarios(w, Space(workload=True, ddp_extra=SPACE.ddp_extra, xla_corners=True,
                                          rank_uniform=True))
        assert xla and not any(xla_unsupported(e.workload) for e in xla)
        assert {e.workload["dtype"] for e in xla} >= {"float64", "complex64"}


def test_the_draw_reaches_every_corner_and_never_a_forbidden_or_upstream_defective_combination():
    drawn = _draw(scenarios(2, SPACE))
    corners = {(k, sc.workload[k]) for sc in drawn for k in WORKLOADS}
    assert corners == {(k, v) for k, vs in WORKLOADS.items() for v in vs}
    for sc in drawn:
        sc.validate()  # reentrant -> static_graph, sparse -> SGD, static_graph -> one plan
        if sc.ddp.get("static_graph"):  # torch's DDP asserts under no_sync with it (UPSTREAM_DEFECTS)
            assert all(len(st["micro"]) == 1 for st in sc.steps)
    xla = _draw(scenarios(2, Space(workload=True, ddp_extra=SPACE.ddp_extra, xla_corners=True,
                                   rank_uniform=True)), 60)
    assert not any(xla_unsupported(sc.workload) for sc in xla)
    plain = _draw(scenarios(2, Space()), 30)
    assert all(sc.workload == PLAIN_WORKLOAD for sc in plain)


def test_oracle_on_sparse_gradients_is_the_mean_of_the_replicas_dense_gradients():
    """One SGD step: the embedding moves by lr x the mean of the replicas' local gradients, rows
    no replica looked up do not move."""
    import torch

    sc = explicit_scenarios(2, SPACE)[2]
    sc.steps = sc.steps[:1]
    sc.steps[0]["micro"] = sc.steps[0]["micro"][-1:]
    sc.optimizer, sc.ddp["find_unused_parameters"] = "sgd", True
    sc.steps[0]["micro"][0]["plan"] = [list(BRANCHES)] * 2
    ref = scenario_reference(sc)
    net = build_scenario_model(sc.seed, False, workload=sc.workload)
    names = [n for n, _ in net.named_parameters()]
    k = names.index("emb.weight")
    sizes = [p.numel() for p in net.parameters()]
    lo = sum(sizes[:k])
    grads, rows = [], set()
    for r in range(2):
        n = sc.steps[0]["micro"][0]["batch"][r]
        x, y = scenario_batch(sc.seed, 0, 0, r, n)
        idx = scenario_indices(sc.seed, 0, 0, r, n)
        rows |= set(idx.reshape(-1).tolist())
        net.zero_grad()
        torch.nn.functional.mse_loss(net(x, idx=idx), y).backward()
        assert net.emb.weight.grad.is_sparse
        grads.append(net.emb.weight.grad.to_dense())
    expected = (net.emb.weight.detach() - sc.lr * (grads[0] + grads[1]) / 2).reshape(-1).numpy()
    got = ref["params"][1][lo:lo + sizes[k]]
    assert np.max(np.abs(got - expected)) < 1e-6
    untouched = [i for i in range(VOCAB) if i not in rows]
    assert untouched and np.array_equal(got.reshape(VOCAB, -1)[untouched],
                                        ref["params"][0][lo:lo + sizes[k]].reshape(VOCAB, -1)[untouched])


def test_workload_models_carry_their_corners_and_stay_deterministic():
    import torch

    from conformance.cases.shared.readback import param_layout
    wl = {"dtype": "complex64", "layout": "channels_last", "grad": "sparse_bag", "graph": "shared"}
    a, b = (build_scenario_model(5, False, workload=wl) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    corners = {e[0]: e[2] for e in param_layout(a) if len(e) > 2}
    assert corners["stem.conv.weight"] == "channels_last"
    assert corners["branch.b.weight"] == "complex64" and corners["emb.weight"] == "sparse gradient"
    assert a.branch["c"].weight is a.branch["a"].weight
    t = build_scenario_model(5, False, workload=dict(PLAIN_WORKLOAD, layout="transposed", dtype="float64"))
    assert not t.head.weight.is_contiguous() and t.head.weight.dtype == torch.float64
    assert scenario_tolerance("cpu", Scenario(**dict(explicit_scenarios(2, SPACE)[0].__dict__))).atol <= 1e-12
