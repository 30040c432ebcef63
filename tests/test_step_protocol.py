"""The step protocol (conformance.cases.shared.step): construction order, every hook called in
its place, gradients read where the strategy keeps them, and a plain class declaring the
protocol's fields as class attributes (docs/strategies.md, "The step protocol")."""
import os
import sys
import types

import pytest
import torch

from conformance import Strategy
from conformance.cases.shared.step import construct
from conformance.errors import Unsupported
from conformance.impls.builtin import ImplSpecError, resolve_impl
from conformance.impls.engines import missing


class _Ctx:
    rank, world_size, device = 0, 1, torch.device("cpu")


def _recording_row(calls, **extra):
    def wrap(module, ctx, kwargs, optimizer):
        calls.append(("wrap", optimizer is not None))
        return module, optimizer

    def hook(name):
        return lambda model, optimizer, ctx: calls.append((name,))

    return Strategy("rec", "", wrap, optimizer_first=True, zero_grad=hook("zero_grad"),
                    before_forward=hook("before_forward"), after_backward=hook("after_backward"),
                    optimizer_step=hook("optimizer_step"), after_step=hook("after_step"),
                    backward=lambda model, loss, optimizer, ctx: calls.append(("backward",)), **extra)


def test_the_engine_calls_every_field_in_order():
    calls = []
    module = torch.nn.Linear(2, 1)
    engine = construct(_recording_row(calls), module, _Ctx(), {},
                       lambda params: calls.append(("optimizer",)) or torch.optim.SGD(params, lr=0.1))
    engine.zero_grad()
    engine.before_forward()
    engine.backward(engine.model(torch.ones(1, 2)).sum())
    engine.sync()
    engine.step()
    assert [c[0] for c in calls] == ["optimizer", "wrap", "zero_grad", "before_forward", "backward",
                                     "after_backward", "optimizer_step", "after_step"]
    assert calls[1] == ("wrap", True)  # optimizer_first: wrap receives the optimizer


def test_gradients_are_read_from_the_declared_attribute_or_gather():
    module = torch.nn.Linear(2, 1)
    for p in module.parameters():
        p.main_grad = torch.full_like(p, 7.0)
    row = Strategy("g", "", lambda module, ctx, kwargs: module, grad_attribute="main_grad")
    engine = construct(row, module, _Ctx(), {}, lambda params: torch.optim.SGD(params, lr=0.1))
    assert all(float(g.min()) == 7.0 for g in engine.grads(module))
    with pytest.raises(Unsupported, match="main_grad"):
        engine.require_grads_in_place("clipping")
    gathered = Strategy("h", "", lambda module, ctx, kwargs: module,
                        gather_grads=lambda module, model, optimizer, ctx: [None, None])
    engine = construct(gathered, module, _Ctx(), {}, lambda params: torch.optim.SGD(params, lr=0.1))
    assert engine.grads(module) == [None, None]


def _partitioning_row():
    """A strategy that empties every parameter in place at construction (as DeepSpeed ZeRO-3
    does) and restores the full values only inside its ``gather_params`` context."""
    import contextlib
    full = {}

    def wrap(module, ctx, kwargs):
        for p in module.parameters():
            full[p] = p.data
            p.data = torch.empty(0)
        return module

    @contextlib.contextmanager
    def gather(module, model, optimizer, ctx):
        for p in module.parameters():
            p.data = full[p]
        try:
            yield
        finally:
            for p in module.parameters():
                p.data = torch.empty(0)
    return Strategy("part", "", wrap, gather_params=gather)


def test_parameters_are_read_inside_the_declared_gather():
    from conformance.cases.shared.readback import flat_params, param_layout
    module = torch.nn.Linear(2, 1)
    expected = flat_params(module)
    engine = construct(_partitioning_row(), module, _Ctx(), {}, lambda params: torch.optim.SGD(params, lr=0.1))
    assert flat_params(module).size == 0  # partitioned: nothing to read outside
    with engine.full_params(module):
        assert (flat_params(module) == expected).all()
        assert [shape for _, shape in param_layout(module)] == [(1, 2), (1,)]
    assert flat_params(module).size == 0  # released on exit
    plain = construct(Strategy("p", "", lambda module, ctx, kwargs: module), torch.nn.Linear(2, 1), _Ctx(), {},
                      lambda params: torch.optim.SGD(params, lr=0.1))
    with plain.full_params(plain.model):  # no gather declared: nothing to do
        assert flat_params(plain.model).size == 3


def _module_with(name, **classes):
    mod = types.ModuleType(name)
    for k, v in classes.items():
        setattr(mod, k, v)
    sys.modules[name] = mod


def test_a_plain_class_declares_fields_as_class_attributes():
    def step_hook(model, optimizer, ctx):
        pass

    class Engine(torch.nn.Module):
        ignores = {"bucket_cap_mb"}
        not_transparent = {"module_hooks": "registers hooks on the module"}
        optimizer_first = True
        after_step = staticmethod(step_hook)

        def __init__(self, module, optimizer, **kwargs):
            super().__init__()
            self.module, self.optimizer = module, optimizer

        def zero_grad(self, set_to_none=True):  # the wrapper's own method: no declaration
            pass

    _module_with("_proto_engine", Engine=Engine)
    row = resolve_impl("_proto_engine:Engine")
    assert row.ignores == frozenset({"bucket_cap_mb"}) and row.optimizer_first and row.after_step is step_hook
    assert row.zero_grad is None and row.not_transparent == Engine.not_transparent
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    assert row.wrap(torch.nn.Linear(1, 1), _Ctx(), {}, opt).optimizer is opt


@pytest.mark.parametrize("attr, value, needle", [
    ("ignores", "bucket_cap_mb", "Strategy.ignores must be a frozenset"),
    ("grad_attribute", 3, "Strategy.grad_attribute must be an attribute name"),
    ("optimizer_first", "yes", "Strategy.optimizer_first must be a bool"),
])
def test_a_declared_field_of_the_wrong_type_is_one_line(attr, value, needle):
    klass = type("Bad", (torch.nn.Module,), {attr: value})
    _module_with(f"_proto_bad_{attr}", Bad=klass)
    with pytest.raises(ImplSpecError, match=needle) as exc:
        resolve_impl(f"_proto_bad_{attr}:Bad")
    assert "\n" not in str(exc.value)


def test_a_missing_engine_is_a_skip_reason_naming_its_extra():
    assert "pip install -e '.[nosuch]'" in missing("nosuch-engine-dist", "1.0", "nosuch")


def test_an_engine_rows_launcher_environment_is_restored_after_construction(monkeypatch):
    """The engine rows export torchrun's variables while the engine is built (engines read them
    there) and put the environment back: a later implementation's environment is not the row's."""
    from conformance.impls.engines._env import launcher_env
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.delenv("GROUP_RANK", raising=False)
    with launcher_env(types.SimpleNamespace(rank=1, world_size=2)):
        assert (os.environ["RANK"], os.environ["LOCAL_WORLD_SIZE"], os.environ["GROUP_RANK"]) == ("1", "2", "0")
    assert os.environ["LOCAL_WORLD_SIZE"] == "1" and "GROUP_RANK" not in os.environ
