"""The transparency oracle (conformance.cases.shared.transparency) on wrappers that change one observable
each, and torch's own DDP (gloo, two replicas) measured transparent on the default table's models.

The wrappers need no process group: the Observer watches the module around any callable."""
import pytest
import torch
from torch import nn

from conformance.cases.shared.transparency import OBSERVABLES, Observer, judge_transparency, merged, probe_modes


class Wrapper(nn.Module):
    """A transparent wrapper: the module under ``module``, its forward called as is."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *a, **kw):
        return self.module(*a, **kw)


class Swap(Wrapper):
    def __init__(self, module):
        for m in module.modules():
            for n, p in list(m._parameters.items()):
                setattr(m, n, nn.Parameter(p.detach().clone()))
        super().__init__(module)


class RngDraw(Wrapper):
    def forward(self, *a, **kw):
        torch.rand(1)
        return super().forward(*a, **kw)


class RngReseed(Wrapper):
    def __init__(self, module):
        super().__init__(module)
        torch.manual_seed(0)


class TrainAll(Wrapper):
    def __init__(self, module):
        super().__init__(module)
        module.train()


class Unprefixed(Wrapper):
    def state_dict(self, *a, **kw):
        return self.module.state_dict(*a, **kw)


class Tupled(Wrapper):
    def forward(self, *a, **kw):
        return tuple([super().forward(*a, **kw)])


class Frozen(Wrapper):
    def __init__(self, module):
        super().__init__(module)
        next(module.parameters()).requires_grad_(False)


class RebindsBuffer(nn.Module):
    """A module that assigns a new tensor to its buffer in forward (its own doing, not a DDP's)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        self.ema = 0.9 * self.ema + 0.1 * x.mean(0).detach()
        return self.fc(x)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _observe(wrapper_cls, module=None, steps=2):
    module = module or _model()
    probe_modes(module)
    torch.manual_seed(5)
    obs = Observer(module, rank=1)
    ddp = wrapper_cls(module)
    obs.wrapped(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for s in range(steps):
        out = obs.call(ddp, torch.ones(2, 3))
        with obs.unchanged_by("backward"):
            (out[0] if isinstance(out, tuple) else out).sum().backward()
        with obs.unchanged_by("the optimizer step"):
            opt.step()
        obs.after_step(s + 1)
    obs.close()
    return obs.result()


FAULTS = [(Swap, "parameter '0.weight' is a new tensor after wrapping"),
          (RngDraw, "RNG state changed by the DDP before the module's forward"),
          (RngReseed, "RNG state changed by the DDP's construction"),
          (TrainAll, "module '1' has training=True after wrapping (was False)"),
          (Unprefixed, "the wrapper's state_dict keys are not the module's under 'module.'"),
          (Tupled, "output is tuple (the module returned tensor)"),
          (Frozen, "parameter '0.weight' has requires_grad=False after wrapping (was True)")]


@pytest.mark.parametrize("wrapper, says", FAULTS, ids=[w.__name__ for w, _ in FAULTS])
def test_a_changed_observable_is_named(wrapper, says):
    got = _observe(wrapper)
    assert any(d.startswith("replica 1: " + says) for d in got["differences"]), got["differences"]
    v = judge_transparency([{"transparency": _observe(Wrapper)}, {"transparency": got}], case="c", impl="i",
                           runtime="cpu", model="m")
    assert v.status == "fail" and v.replica == 1 and says in v.reason


def test_a_transparent_wrapper_passes_and_says_what_it_checked():
    got = _observe(Wrapper)
    assert got["differences"] == []
    assert set(got["checked"]) == set(OBSERVABLES)
    v = judge_transparency([{"transparency": got}] * 2, case="c", impl="i", runtime="cpu", model="m")
    assert v.status == "pass" and all(o in v.reason for o in OBSERVABLES)


def test_the_module_rebinding_its_own_buffer_is_not_the_ddps_doing():
    assert _observe(Wrapper, RebindsBuffer(), steps=3)["differences"] == []


def test_a_raising_forward_leaves_no_difference():
    module = RebindsBuffer()
    obs = Observer(module, rank=0)
    ddp = Wrapper(module)
    obs.wrapped(ddp)
    with pytest.raises(RuntimeError):
        obs.call(ddp, torch.ones(2, 5))  # the wrong width: the module raises after rebinding
    obs.after_step(1)
    assert obs.result()["differences"] == []


def test_a_forward_the_observer_cannot_see_into_is_the_modules_own_rebinding():
    # a compiled forward+backward: no probes, so forward_unseen takes what the forward left
    results = []
    for unseen in (False, True):
        module = RebindsBuffer()
        obs = Observer(module, rank=0, skip={"output": "compiled"})
        ddp = Wrapper(module)
        obs.wrapped(ddp)
        ddp(torch.ones(2, 3)).sum().backward()
        if unseen:
            obs.forward_unseen()
        obs.after_step(1)
        results.append(obs.result()["differences"])
    assert results[0] == ["replica 0: buffer 'ema' is a new tensor after step 1"] and results[1] == []


def test_skipped_observables_are_not_compared_and_are_said():
    module = _model()
    obs = Observer(module, rank=0, skip={"parameters": "sharded by design"})
    obs.wrapped(Swap(module))
    r = merged([obs])
    assert r["differences"] == [] and "parameters" not in r["checked"]
    v = judge_transparency([{"transparency": r}] * 2)
    assert v.status == "pass" and "not checked: parameters (sharded by design)" in v.reason


def test_nothing_checked_is_vacuous_and_no_record_is_skip():
    empty = {"differences": [], "checked": [], "unobserved": {}}
    assert judge_transparency([{"transparency": empty}] * 2).status == "vacuous"
    assert judge_transparency([{}, {}]).status == "skip"


def test_probe_modes_sets_only_torch_leaves_that_ignore_the_flag():
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout(), nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Linear(2, 2))
    assert probe_modes(m) == ["2"]
    assert m[1].training and m[3].training and not m[2].training


class Relaid(Wrapper):
    """Makes a non-contiguous parameter contiguous in place: the same object, another layout."""

    def __init__(self, module):
        for p in module.parameters():
            if not p.is_contiguous():
                p.data = p.data.contiguous()
        super().__init__(module)


class LeaksDtype(Wrapper):
    def __init__(self, module):
        super().__init__(module)
        torch.set_default_dtype(torch.float64)


def test_a_parameter_laid_out_anew_is_named():
    module = _model()
    with torch.no_grad():  # a transposed weight, as a user's tied or channels-last layer holds
        module[0].weight = nn.Parameter(module[0].weight.detach().t().contiguous().t())
    got = _observe(Relaid, module)
    assert any("parameter '0.weight' is laid out as float32 [4, 3] strides [3, 1]" in d
               for d in got["differences"]), got["differences"]


def test_a_leaked_process_setting_is_named():
    module = _model()
    obs = Observer(module, rank=0)
    try:
        obs.wrapped(LeaksDtype(module))
    finally:
        torch.set_default_dtype(torch.float32)
    got = obs.result()["differences"]
    assert any("default dtype is float64 after wrapping (was float32)" in d for d in got), got


def test_a_world_puts_back_what_a_task_left_changed():
    """The next implementation in the same world must not inherit a leaked setting."""
    from conformance.worlds.spawned import World
    from tests import tasks
    w = World("cpu", 2)
    try:
        assert w.run(tasks.leak_default_dtype) == ["torch.float64"] * 2
        assert w.run(tasks.read_default_dtype) == ["torch.float32"] * 2
    finally:
        w.close()
