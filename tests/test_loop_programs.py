"""The loop programs (``scenario.loop``): the format, and the oracle's DDP semantics for each loop
dimension, each against what a hand-computed loop gives (docs/scenarios.md, "The loop programs")."""
import collections
import dataclasses
import json

import numpy as np
import pytest
import torch

from conformance.cases.scenario.dimensions import BRANCHES, EVAL_DATA, MODULES, PLAIN_LOOP, PLAIN_MODULE
from conformance.cases.scenario.explicit import explicit_loop_scenarios
from conformance.cases.scenario.format import Scenario, ScenarioError
from conformance.cases.scenario.generate import Space, scenarios
from conformance.cases.scenario.oracle import eval_values, scenario_reference
from ddp_impl.outputs import output_tensors

pytestmark = pytest.mark.cpu


def program(steps, optimizer="sgd", find_unused=True, rebind=False, checkpoint_at=None, **loop):
    return Scenario(seed=5, lr=0.2, optimizer=optimizer,
                    ddp={"find_unused_parameters": find_unused, "broadcast_buffers": True},
                    rebind_buffers=rebind, loss_scale_log2=0, checkpoint_at=checkpoint_at, steps=steps,
                    loop=dict(PLAIN_LOOP, **loop))


def step(*plans, sync=None, evals=(), batch=(2, 3)):
    micro = [{"batch": list(batch), "plan": [list(p)] * len(batch)} for p in plans]
    for j, s in enumerate(sync or ()):
        if s is not None:
            micro[j]["sync"] = s
    out = {"micro": micro}
    if evals:
        out["eval"] = [dict(e, batch=list(batch)) for e in evals]
    return out


def c_weight(ref, s):
    """Branch c's weight after step ``s`` (0 = construction) in the oracle's flat parameters."""
    from conformance.cases.scenario.model import build_scenario_model
    from conformance.cases.shared.readback import param_layout
    names = [n for n, _ in param_layout(build_scenario_model(5, False))]
    sizes = [p.numel() for _, p in build_scenario_model(5, False).named_parameters()]
    at = names.index("branch.c.weight")
    lo = sum(sizes[:at])
    return ref["params"][s][lo:lo + sizes[at]]


def test_format_round_trip_and_plain_loop_left_out():
    for w in (2, 3):
        for sc in explicit_loop_scenarios(w, Space(loop=True)):
            assert Scenario.from_json(json.loads(json.dumps(sc.to_json()))) == sc
    plain = program([step(BRANCHES)])
    assert "loop" not in plain.to_json()  # files written before the loop axis stay as they were
    assert Scenario.from_json(plain.to_json()).loop == PLAIN_LOOP


@pytest.mark.parametrize("change, message", [
    (lambda d: d["steps"][0]["micro"][-1].update(sync=False), "true at the window's last micro-step"),
    (lambda d: d["loop"].update(lr_drop_at=0), "lr_drop_at"),
    (lambda d: d["loop"].update(clip="value"), "loop clip"),
    (lambda d: d["loop"].update(warmup=3), "loop: an object with keys"),
    (lambda d: d["steps"][0].update(eval=[{"at": 9, "grad": "no_grad", "mode": "eval", "batch": [1, 1]}]),
     "a micro-step index"),
    (lambda d: d["steps"][0].update(eval=[{"at": 0, "grad": "enable_grad", "mode": "eval", "batch": [1, 1]}]),
     "grad one of"),
    (lambda d: (d.update(rebind_buffers=True), d["steps"][0].update(
        eval=[{"at": 0, "grad": "inference_mode", "mode": "train", "batch": [1, 1]}])), "inference tensors"),
    (lambda d: d["steps"][0]["micro"][0].update(forwards=0), "forwards 0: an integer 1..3"),
    (lambda d: d["steps"][0]["micro"][0].update(forwards=4), "forwards 4"),
    (lambda d: d["steps"][0]["micro"][0].update(forwards=True), "forwards True"),
])
def test_bad_programs_are_one_line_errors(change, message):
    d = program([step(BRANCHES), step(BRANCHES)], clip="norm").to_json()
    change(d)
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_json(d)


def test_a_zero_gradient_decays_and_a_none_gradient_does_not():
    """Branch c used at step 1 only: with zero_grad(set_to_none=False) its gradient at step 2 is a
    zero tensor (the reducer leaves a parameter no replica used untouched), which SGD's weight
    decay still applies; with set_to_none it is None and the parameter stays."""
    steps = [step(BRANCHES), step(["a", "b"])]
    zeros = scenario_reference(program(steps, optimizer="sgd_wd", zero_grad="zeros"))
    none = scenario_reference(program(steps, optimizer="sgd_wd"))
    assert np.array_equal(c_weight(none, 2), c_weight(none, 1))
    np.testing.assert_allclose(c_weight(zeros, 2), c_weight(zeros, 1) * (1 - 0.2 * 0.01), rtol=1e-6)


def test_synced_backwards_sum_their_averaged_gradients():
    """Two synced backwards in one step give the same parameters as one accumulation window over
    the same micro-batches (sum of averages = average of sums), and a parameter reached only by the
    first keeps its averaged gradient through the second."""
    window = scenario_reference(program([step(BRANCHES, ["a", "b"])]))
    synced = scenario_reference(program([step(BRANCHES, ["a", "b"], sync=[True])]))
    np.testing.assert_allclose(synced["params"], window["params"], atol=1e-6)
    moved = c_weight(synced, 1) - c_weight(synced, 0)
    assert np.abs(moved).max() > 1e-3


def test_buffers_after_a_forward_without_grad_are_not_broadcast():
    """A forward without grad clears DDP's forward-sync flag, whatever the module's mode. In eval
    mode it changes no buffer, and it was itself broadcast (it followed a synced step): step 2's
    training forward starts every replica from rank 0's buffers, so replica r ends with
    ``0.9 * B + 0.1 * m_r`` (``m_r`` its stem's batch mean) and replicas differ by
    ``0.1 * (m_1 - m_0)``. In train mode it updates each replica's buffers from its own data and
    the training forward does not broadcast them: that relation no longer holds."""
    import torch

    from conformance.cases.scenario.model import build_scenario_model, scenario_batch
    batch = (2, 3)

    def run(mode):
        sc = program([step(BRANCHES, batch=batch), step(BRANCHES, batch=batch, evals=[
            {"at": 0, "grad": "no_grad", "mode": mode}])])
        return scenario_reference(sc)
    ref = run("eval")
    net = build_scenario_model(5, False)
    torch.nn.utils.vector_to_parameters(torch.tensor(ref["params"][1], dtype=torch.float32), net.parameters())
    with torch.no_grad():
        m = [torch.tanh(net.stem(scenario_batch(5, 1, 0, r, n)[0])).mean(0).double().numpy()
             for r, n in enumerate(batch)]
    ema = slice(0, 12)
    expected = 0.1 * (m[1] - m[0])
    np.testing.assert_allclose(ref["buffers"][2][1, ema] - ref["buffers"][2][0, ema], expected, atol=1e-6)
    train = run("train")["buffers"][2]
    assert np.abs(train[1, ema] - train[0, ema] - expected).max() > 1e-4


def ema_gaps(ref, s, batch, data):
    """``(replica 1 - replica 0)`` of buffer 'ema' after step ``s`` (1-based) of a program the
    oracle trained to ``ref``, and what it must be when the forwards of step ``s`` on micro-batches
    ``data`` (micro indices, in order) ran on each replica's own buffers after the last broadcast:
    a train-mode forward sets ``ema = 0.9 * ema + 0.1 * m`` (``m``: the replica's stem batch mean;
    the parameters do not change within a step), so the gap is
    ``sum_k 0.1 * 0.9 ** (n - 1 - k) * (m_1[k] - m_0[k])``."""
    import torch

    from conformance.cases.scenario.model import build_scenario_model, scenario_batch
    net = build_scenario_model(5, False)
    torch.nn.utils.vector_to_parameters(torch.tensor(ref["params"][s - 1], dtype=torch.float32), net.parameters())
    want = 0.0
    with torch.no_grad():
        for j in data:
            m = [torch.tanh(net.stem(scenario_batch(5, s - 1, j, r, n)[0])).mean(0).double().numpy()
                 for r, n in enumerate(batch)]
            want = 0.9 * want + 0.1 * (m[1] - m[0])
    ema = slice(0, 12)
    return ref["buffers"][s][1, ema] - ref["buffers"][s][0, ema], want


@pytest.mark.parametrize("synced", [True, False])
def test_the_second_of_two_forwards_starts_from_rank_0s_buffers_when_synced(synced):
    """Two forwards before one backward (a GAN's discriminator): the first, grad-enabled and synced,
    arms DDP's forward-sync flag, so the second starts every replica from rank 0's buffers; under
    ``no_sync()`` the flag stays clear, and neither the second forward nor the window's synced
    micro-step after it broadcasts: every forward of the step since its first adds up."""
    from conformance.cases.scenario.dimensions import FORWARD_DATA
    batch = (2, 3)
    if synced:
        two = step(BRANCHES, batch=batch)
        since_broadcast = [FORWARD_DATA]
    else:
        two = step(BRANCHES, BRANCHES, batch=batch)
        since_broadcast = [0, FORWARD_DATA, 1]
    two["micro"][0]["forwards"] = 2
    ref = scenario_reference(program([step(BRANCHES, batch=batch), two]))
    gap, want = ema_gaps(ref, 2, batch, since_broadcast)
    np.testing.assert_allclose(gap, want, atol=1e-6)
    assert np.abs(want).max() > 1e-3  # the replicas' data differ: the gap can tell


@pytest.mark.parametrize("grad, since_broadcast", [("enabled", [0]), ("no_grad", [EVAL_DATA, 0]), ("raising", [0])])
def test_a_grad_enabled_forward_without_backward_arms_the_buffer_broadcast(grad, since_broadcast):
    """A train-mode forward no backward follows (validation written without ``no_grad``) updates
    each replica's buffers; with grad enabled it counts as a synced training forward, so the
    training forward after it starts from rank 0's buffers; under ``no_grad`` it does not. A forward
    whose module raises after its buffers moved (a skipped bad batch) leaves the flag as the synced
    training forward before it set it: the next forward broadcasts too."""
    batch = (2, 3)
    ref = scenario_reference(program([step(BRANCHES, batch=batch), step(BRANCHES, batch=batch, evals=[
        {"at": 0, "grad": grad, "mode": "train"}])]))
    gap, want = ema_gaps(ref, 2, batch, since_broadcast)
    np.testing.assert_allclose(gap, want, atol=1e-6)


def test_a_frozen_teacher_moves_the_target_and_leaves_the_buffer_rule():
    """A second DDP in the loop (a frozen teacher under no_grad before each training forward): its
    prediction enters the target, so the trained parameters change from step 1; the trained model's
    buffers after step 1 stay those of the same program without it (its forwards are its own)."""
    steps = [step(BRANCHES, BRANCHES, batch=(2, 3)), step(BRANCHES, batch=(2, 3))]
    steps[0]["micro"][0]["forwards"] = 2
    plain = scenario_reference(program(steps))
    taught = scenario_reference(program(steps, teacher="frozen"))
    np.testing.assert_array_equal(taught["buffers"][1], plain["buffers"][1])
    assert np.abs(taught["params"][1] - plain["params"][1]).max() > 1e-3


def test_backward_in_eval_mode_is_averaged_and_leaves_buffers():
    ref = scenario_reference(program([step(BRANCHES)] * 2, module_mode="eval", find_unused=False))
    assert np.array_equal(ref["buffers"][2], ref["buffers"][0])  # eval mode: no buffer update
    assert np.abs(ref["params"][2] - ref["params"][0]).max() > 1e-3


def test_clipping_bounds_the_synced_gradient_norm():
    sc = program([step(BRANCHES)], clip="norm", find_unused=False)
    clipped, free = scenario_reference(sc), scenario_reference(program([step(BRANCHES)], find_unused=False))
    norm = np.linalg.norm(clipped["params"][1] - clipped["params"][0]) / sc.lr
    assert norm == pytest.approx(0.25, rel=1e-4)  # it binds here: the free step is longer
    assert np.linalg.norm(free["params"][1] - free["params"][0]) / sc.lr > 0.3


def test_learning_rate_drop_scales_the_step():
    plain = scenario_reference(program([step(BRANCHES)] * 2, find_unused=False))
    drop = scenario_reference(program([step(BRANCHES)] * 2, find_unused=False, lr_drop_at=1))
    np.testing.assert_array_equal(drop["params"][1], plain["params"][1])
    d_plain, d_drop = plain["params"][2] - plain["params"][1], drop["params"][2] - drop["params"][1]
    np.testing.assert_allclose(d_drop, 0.5 * d_plain, atol=1e-7)


def test_generated_programs_are_valid_and_enter_every_loop_dimension():
    from hypothesis import HealthCheck, given, settings
    seen = set()

    @settings(max_examples=120, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(sc=scenarios(3, Space(loop=True)))
    def draw(sc):
        sc.validate()
        seen.update(f"{k}={v}" for k, v in sc.loop.items() if k != "lr_drop_at")
        seen.add(f"lr_drop={sc.loop['lr_drop_at'] is not None}")
        seen.add(f"optimizer={sc.optimizer}")
        seen.update(f"module.{k}={v}" for k, v in sc.module.items())
        for s in range(len(sc.steps)):
            for _, f in enumerate(sc.steps[s].get("eval", ())):
                seen.add(f"eval={f['grad']},{f['mode']}")
            if sum(sc.synced(s, j) for j in range(len(sc.steps[s]["micro"]))) > 1:
                seen.add("synced_backwards>1")
            for j in range(len(sc.steps[s]["micro"])):
                if sc.forwards(s, j) > 1:
                    seen.add(f"forwards>1,{'synced' if sc.synced(s, j) else 'no_sync'}")
    draw()
    want = {"zero_grad=zeros", "module_mode=eval", "clip=norm", "lr_drop=True", "optimizer=sgd_wd",
            "eval=no_grad,train", "eval=no_grad,eval", "eval=inference_mode,eval", "eval=enabled,train",
            "eval=raising,train", "teacher=frozen",
            "synced_backwards>1", "forwards>1,synced", "forwards>1,no_sync"}
    want |= {f"module.{k}={v}" for k, vals in MODULES.items() for v in vals}
    assert want <= seen, sorted(want - seen)


def test_a_checkpoint_reload_starts_without_gradients():
    """A state dict holds no gradients: after the reload branch c (unused from then on) has a None
    gradient even under zero_grad(set_to_none=False), so momentum does not move it (before the
    reload it would hold a zero gradient, and momentum would)."""
    steps = [step(BRANCHES), step(["a", "b"]), step(["a", "b"])]
    reload = scenario_reference(program(steps, optimizer="sgd_momentum", zero_grad="zeros", checkpoint_at=0))
    kept = scenario_reference(program(steps, optimizer="sgd_momentum", zero_grad="zeros"))
    assert np.array_equal(c_weight(reload, 2), c_weight(reload, 1))
    assert not np.array_equal(c_weight(kept, 2), c_weight(kept, 1))


# --------------------------------------------------------------------------
# the module axis drawn with the programs (docs/scenarios.md, "The module axis")
# --------------------------------------------------------------------------

def module_program(steps, bcast=True, **module):
    sc = program(steps, find_unused=False)
    sc.ddp["broadcast_buffers"] = bcast
    sc.module = dict(PLAIN_MODULE, **module)
    sc.validate()
    return sc


def one_sgd_step(module, batch=(2, 3), kwargs=True):
    """DDP's first SGD step computed by hand on one device: every replica's local-mean gradient
    on its own batch (with the module's forward keywords unless ``kwargs`` is false), their
    equal average, ``p - lr * mean`` (flat parameters, the oracle's order)."""
    import torch

    from conformance.cases.scenario.dimensions import prediction_of
    from conformance.cases.scenario.model import build_scenario_model, forward_kwargs, scenario_batch
    net = build_scenario_model(5, False, module=module)
    grads = []
    for r, n in enumerate(batch):
        net.zero_grad(set_to_none=True)
        x, y = scenario_batch(5, 0, 0, r, n)
        kw = forward_kwargs(module, 5, 0, 0, r, n) if kwargs else {}
        torch.nn.functional.mse_loss(prediction_of(net(x, **kw)), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    return (flat - 0.2 * torch.stack(grads).mean(0)).double().numpy()


@pytest.mark.parametrize("dims", [{"kwargs": "scale"}, {"kwargs": "mask"}, {"params": "containers"},
                                  {"parametrize": "symmetric"}, {"parametrize": "weight_norm"},
                                  {"output": "namedtuple"}])
def test_a_module_dimension_trains_as_ddp_on_one_device(dims):
    """Each module value against a hand-computed first step: forward keywords reach the module
    (``DistributedDataParallel.forward`` calls ``module(*inputs, **kwargs)``), a parametrized weight
    trains its ``original`` tensor(s), container-held parameters are averaged as any other, the loss
    reads a namedtuple's ``pred``. Able to fail: a module run without its keywords steps elsewhere."""
    module = dict(PLAIN_MODULE, **dims)
    ref = scenario_reference(module_program([step(BRANCHES)], **dims))
    np.testing.assert_allclose(ref["params"][1], one_sgd_step(module), atol=1e-6)
    if dims.get("kwargs", "none") != "none":
        assert np.abs(ref["params"][1] - one_sgd_step(module, kwargs=False)).max() > 1e-3


def test_module_dimensions_name_their_tensors():
    from conformance.cases.scenario.model import build_scenario_model
    from conformance.cases.shared.readback import buffer_layout, param_layout
    names = {n for n, *_ in param_layout(build_scenario_model(5, False, module={
        "params": "containers", "parametrize": "symmetric"}))}
    assert {"gains.0", "gains.1", "offsets.h", "offsets.out", "branch.a.parametrizations.weight.original"} <= names
    names = {n for n, *_ in param_layout(build_scenario_model(5, False, module={"parametrize": "weight_norm"}))}
    assert {"head.parametrizations.weight.original0", "head.parametrizations.weight.original1"} <= names
    layout = buffer_layout(build_scenario_model(5, False, module={"int_buffer": "samples"}))
    assert ("seen", (), "int64") in [tuple(e) for e in layout]


@pytest.mark.parametrize("rebind", [False, True])
def test_an_int_buffer_follows_rank_0_at_each_synced_forward(rebind):
    """The int64 ``seen`` (``+= n`` per training forward) with local batches 2 and 3: DDP
    broadcasts every buffer, integer ones too, at construction and before each training forward
    after a synced one (``torch/distributed/utils.py`` ``_sync_module_states``,
    ``DistributedDataParallel._sync_buffers``), so replica r holds rank 0's count plus its own
    batch: 0 -> [2, 3] -> [4, 5]. Without ``broadcast_buffers`` each keeps its own start (0 and
    ``seen_start(0.5)`` = 5) and count: [2, 8] -> [4, 11]."""
    from conformance.cases.scenario.model import seen_start
    from conformance.cases.shared.loop import rank_buffer_offset
    for bcast, want in ((True, [[0, 0], [2, 3], [4, 5]]), (False, [[0, 5], [2, 8], [4, 11]])):
        sc = module_program([step(BRANCHES), step(BRANCHES)], bcast=bcast, int_buffer="samples")
        sc.rebind_buffers = rebind
        assert seen_start(rank_buffer_offset(1)) == 5
        got = scenario_reference(sc)["buffers"][:, :, -1]
        assert got.tolist() == want, (bcast, got.tolist())


def test_a_file_from_before_the_teacher_dimension_parses():
    d = program([step(BRANCHES)], clip="norm").to_json()
    del d["loop"]["teacher"]
    assert Scenario.from_json(d).loop == dict(PLAIN_LOOP, clip="norm")


def test_a_file_from_before_the_new_module_dimensions_parses():
    d = module_program([step(BRANCHES)], output="dict").to_json()
    d["module"] = {"output": "dict", "buffers": "persistent", "hook": "none"}
    assert Scenario.from_json(d).module == dict(PLAIN_MODULE, output="dict")
    d["module"]["parametrize"] = "spectral"
    with pytest.raises(ScenarioError, match="module parametrize"):
        Scenario.from_json(d)


def test_no_grad_enabled_forward_is_drawn_before_a_no_sync_window_with_find_unused():
    """UPSTREAM_DEFECTS ("enabled_forward", "no_sync"), findings.md 15: under
    find_unused_parameters the next training forward after a grad-enabled forward without backward
    is a synced one (or a new DDP after the checkpoint reload, or none)."""
    from hypothesis import HealthCheck, given, settings
    seen = {"checked": 0}

    @settings(max_examples=150, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(sc=scenarios(2, Space(loop=True)))
    def draw(sc):
        if not sc.ddp["find_unused_parameters"]:
            return
        for s, step in enumerate(sc.steps):
            for f in step.get("eval", ()):
                if f["grad"] != "enabled":
                    continue
                seen["checked"] += 1
                if f["at"] < len(step["micro"]):
                    assert sc.synced(s, f["at"]), (s, f)
                elif s + 1 < len(sc.steps) and sc.checkpoint_at != s:
                    assert sc.synced(s + 1, 0), (s, f)
    draw()
    assert seen["checked"] > 0  # the draw does make grad-enabled forwards under find_unused_parameters


def test_eval_outputs_are_read_from_every_structure_torchs_ddp_walks():
    """A forward's output as torch's DDP walks it: tensors in dataclasses, dicts (a defaultdict
    too), namedtuples, lists and tuples; detached in place of the structure, values in order."""
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        extra: dict

    pair = collections.namedtuple("pair", "x y")
    t = torch.arange(3.0, requires_grad=True) * 2
    out = Out(t, {"k": [pair(t + 1, None), (t + 2,)], "d": collections.defaultdict(list, z=t + 3)})
    assert eval_values(out).tolist() == [v + k for k in range(4) for v in (0.0, 2.0, 4.0)]
    kept = output_tensors(out, torch.Tensor.detach)
    assert isinstance(kept, Out) and isinstance(kept.extra["k"][0], pair)
    assert not any(x.requires_grad for x in output_tensors(kept))


def test_the_output_walk_keeps_no_tensor_alive():
    """The walk leaves no reference cycle behind: the tensors it walked are freed as soon as the
    caller drops them, without the cyclic collector (on XLA a tensor still alive at mark_step is
    a graph output, and replica threads whose collector ran at different times compiled
    different graphs whose collectives never met)."""
    import gc
    import weakref
    gc.disable()
    try:
        t = torch.ones(3, requires_grad=True) * 2
        seen = weakref.ref(t)
        kept = output_tensors({"pred": [t]}, lambda x: x.detach())
        del t, kept
        assert seen() is None
    finally:
        gc.enable()
