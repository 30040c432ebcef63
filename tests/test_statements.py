"""The statement table of the loop programs (conformance/cases/scenario/statements.py): each row is
a loop dimension drawn, validated and computed by the oracle; docs/programs.md is its survey."""
import pytest

from conformance.cases.scenario.dimensions import LOOP_PHRASES, LOOPS, PLAIN_LOOP
from conformance.cases.scenario.explicit import loop_builders
from conformance.cases.scenario.format import Scenario, ScenarioError
from conformance.cases.scenario.oracle import scenario_reference
from conformance.cases.scenario.statements import STATEMENTS, before_wrap, first_layer

pytestmark = pytest.mark.cpu


def test_every_statement_is_a_loop_dimension_with_a_phrase_per_value():
    for s in STATEMENTS:
        assert LOOPS[s.key] == s.values and PLAIN_LOOP[s.key] == s.values[0]
        assert {(s.key, v) for v in s.values[1:]} <= set(LOOP_PHRASES), s.key
        assert s.programs, f"{s.key}: name the surveyed programs it covers (docs/programs.md)"


def _program(**loop):
    sc, micro, ev = loop_builders(2, 5, False)
    return sc([{"micro": [micro(), micro()], "eval": [ev(0, "enabled", "train")]} for _ in range(3)],
              optimizer="sgd_momentum", module={"buffer_use": "centre"}, **loop)


def test_a_stem_frozen_before_wrapping_never_moves_and_the_rest_trains():
    import numpy as np
    from conformance.cases.scenario.model import build_scenario_model
    net = build_scenario_model(5, False)
    before_wrap({"freeze": "stem"}, net)
    frozen = first_layer(net)
    assert frozen and all(not p.requires_grad for p in frozen)
    n = sum(p.numel() for p in frozen)  # the stem's values lead the flat parameter vector
    ref = scenario_reference(_program(freeze="stem"))["params"]
    assert np.array_equal(ref[-1, :n], ref[0, :n]) and not np.array_equal(ref[-1, n:], ref[0, n:])


def test_a_frozen_forward_leaves_ddp_semantics_unchanged():
    """torch arms the next broadcast on grad mode alone: the oracle of a program whose
    grad-enabled forwards run frozen equals the unfrozen one's, to the bit."""
    import numpy as np
    a, b = scenario_reference(_program(toggle="frozen")), scenario_reference(_program())
    assert all(np.array_equal(a[k], b[k]) for k in ("params", "buffers", "optim"))


def test_a_statement_that_cannot_go_with_the_rest_is_refused_with_its_reason():
    d = _program(freeze="stem").to_json()
    d["workload"] = {"dtype": "float32", "layout": "contiguous", "grad": "dense", "graph": "checkpoint_reentrant"}
    d["ddp"]["static_graph"] = True
    for st in d["steps"]:
        st["micro"] = st["micro"][-1:]
        st.pop("eval", None)
    with pytest.raises(ScenarioError, match="loop freeze 'stem'.*reentrant"):
        Scenario.from_json(d)


def test_a_target_forward_is_judged_as_an_eval_output_and_moves_the_buffers():
    """``peek``: one no_grad forward per training forward, its output kept with the evaluation
    outputs; in train mode it updates ``ema``, which feeds the output, so the program differs."""
    import numpy as np
    a, b = scenario_reference(_program(peek="no_grad")), scenario_reference(_program())
    assert a["evals"].shape[0] == b["evals"].shape[0] == 2
    assert a["evals"].shape[1] > b["evals"].shape[1] > 0
    assert not np.array_equal(a["buffers"], b["buffers"])


def test_saving_on_rank_0_calls_state_dict_there_only_and_changes_nothing():
    import numpy as np
    from conformance.cases.scenario.statements import after_step
    calls = []

    class Spy:
        def state_dict(self):
            calls.append(1)
            return {}
    after_step({"save": "rank0"}, 1, Spy())
    after_step({"save": "none"}, 0, Spy())
    assert not calls
    after_step({"save": "rank0"}, 0, Spy())
    assert calls == [1]
    a, b = scenario_reference(_program(save="rank0")), scenario_reference(_program())
    assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in ("params", "buffers", "optim", "evals"))


def test_eval_values_flatten_every_floating_tensor_of_an_output():
    import numpy as np
    import torch
    from conformance.cases.scenario.oracle import eval_values, padded
    out = {"pred": torch.ones(2, 3), "n": torch.tensor([4]), "tag": "x", "z": torch.tensor([1 + 2j])}
    assert eval_values(out).tolist() == [1.0] * 6 + [1.0, 2.0]
    p = padded([np.ones(2), np.ones(3)])
    assert p.shape == (2, 3) and np.isnan(p[0, 2])
