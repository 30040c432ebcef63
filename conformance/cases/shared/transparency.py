"""The transparency oracle: what the module, the optimizer, the random number generator and the
user's code observe must be what they would observe without the DDP.

torch's ``DistributedDataParallel`` (``torch/nn/parallel/distributed.py``) averages gradients and
broadcasts parameters and buffers *in place* (construction, and buffers before each forward);
beyond that it leaves the wrapped module as it was: the same parameter and buffer objects, their
``requires_grad``, every submodule's ``training`` flag, the module's hook dictionaries, its own
``state_dict`` keys (the wrapper's are the same under ``module.``), the parameters' layout and
the process-wide torch settings, and it draws no random numbers (the measurement is in
docs/transparency.md). It returns the module's output as the module returned it (the same
containers, keys and non-tensor members; tensors of the same shape and dtype, possibly new objects).

An :class:`Observer` records these observables (:data:`OBSERVABLES`) on one replica around the
DDP; :func:`judge_transparency` turns the replicas' differences into the ``transparency``
verdict. The default CPU generator is observed (``torch.get_rng_state()``); an XLA device's is
not (its seed advances with the step marker, outside the DDP).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib

from conformance.cases.shared.checks import TRANSPARENCY
from conformance.cases.shared.step import Engine
from conformance.worlds import isolation
from conformance.worlds.runtimes.base import torch_settings
from conformance.verdict import Verdict


#: Every observable the oracle compares, with what it means (the verdict's vocabulary).
OBSERVABLES = {
    "parameters": "each parameter is the same tensor object under the same name (an optimizer built "
                  "on module.parameters() before wrapping trains the model)",
    "buffers": "each buffer is the same tensor object under the same name (broadcast in place)",
    "requires_grad": "each parameter's requires_grad",
    "training": "every submodule's training flag",
    "module_hooks": "the module's forward / backward / state-dict hook dictionaries",
    "rng": "the default generator's state: the DDP draws no random numbers and synchronises none",
    "state_dict": "the module's state_dict keys, and the wrapper's the same under 'module.'",
    "layout": "each parameter's dtype, shape, strides and device (a DDP may not re-lay a parameter out)",
    "process_state": "the process-wide torch settings user code reads: default dtype, grad mode, anomaly "
                     "mode, deterministic algorithms, intra-op threads; and what a later implementation in "
                     "the same process reads (conformance.worlds.isolation.INVENTORY: the torch.distributed "
                     "default group and backends, environment variables, functions of torch, "
                     "torch.distributed and torch_xla, global hooks, autocast and other thread modes, "
                     "torch_xla's SPMD mode), against the world's snapshot",
    "output": "the DDP returns the module's output structure: containers, keys, non-tensor members, "
              "tensor shapes and dtypes (probed by hooks around the module's forward, which also "
              "separate the DDP's RNG use and tensor rebinding from the module's own; a strategy that "
              "declares it not transparent gets no probes)",
}
#: Why the RNG is not observed where replicas are threads of one process (the PJRT thread
#: topology): the default generator is the process's, drawn by every replica.
SHARED_RNG = "the replicas are threads of one process and share its default generator"
#: Where a change of the world's snapshot found before wrapping comes from: a world puts the
#: snapshot back before each implementation's first case, and the kit changes none of it.
FOUND_BEFORE = ("left by this implementation: its import, another replica thread's wrap or an earlier case "
                "of it in this world")
#: At most this many differences are kept per replica (the first ones: where it started).
MAX_DIFFERENCES = 8
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")
#: Leaf modules whose computation does not read ``training``: the probe sets some to eval mode
#: before wrapping (a frozen submodule, as users keep a teacher or an embedding) so that a DDP
#: that switches modes is seen, while the numbers stay those of the training run.
MODE_FREE = ("Linear", "Conv1d", "Conv2d", "Conv3d", "Embedding", "EmbeddingBag", "LayerNorm",
             "ReLU", "GELU", "Tanh", "Sigmoid", "Identity", "Flatten")


#: Replica r seeds its default generator with ``RNG_SEED + RNG_SEED_STRIDE * r`` before wrapping,
#: as a user seeds each rank's dropout: a DDP that synchronises the generators changes a state.
RNG_SEED, RNG_SEED_STRIDE = 20_261, 7_919


def observed_wrap(row, module, ctx, wrap):
    """``(built, observer)`` (``built`` what ``wrap()`` returned: a DDP or an
    :class:`~conformance.cases.shared.step.Engine`): the replica's default generator seeded per rank (:data:`RNG_SEED`;
    not where replicas share it), then ``wrap()`` (which builds the DDP around ``module``)
    between an :class:`Observer`'s first snapshot and :meth:`Observer.wrapped`. The observer of
    strategy ``row`` leaves out its documented changes (``Strategy.not_transparent``) and the RNG
    where the replica shares its process's generator (:data:`SHARED_RNG`)."""
    skip = dict(row.not_transparent)
    if "thread" in ctx.extra:
        skip.setdefault("rng", SHARED_RNG)
    if "rng" not in skip:
        import torch
        torch.manual_seed(RNG_SEED + RNG_SEED_STRIDE * ctx.rank)
    obs = Observer(module, ctx.rank, skip)
    built = wrap()
    obs.wrapped(built.model if isinstance(built, Engine) else built)
    return built, obs


def rng_digest() -> str:
    """SHA-1 of the default CPU generator's state (``torch.get_rng_state()``, a uint8 tensor)."""
    import torch
    return hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]


def probe_modes(module) -> list[str]:
    """Set every other :data:`MODE_FREE` leaf of ``module`` to eval mode (the first stays in train
    mode); return the names set. Numbers unchanged: those modules ignore the flag."""
    leaves = [(n, m) for n, m in module.named_modules() if n and type(m).__name__ in MODE_FREE
              and type(m).__module__.startswith("torch.nn.") and not list(m.children())][1::2]
    for _, m in leaves:
        m.training = False
    return [n for n, _ in leaves]


@dataclasses.dataclass
class _Snapshot:
    params: dict
    buffers: dict
    requires_grad: dict
    training: dict
    hooks: dict
    layout: dict
    process: dict


def process_state() -> dict:
    """:func:`conformance.worlds.runtimes.base.torch_settings` with printable values."""
    return {k: str(v).removeprefix("torch.") if k == "default dtype" else v for k, v in torch_settings().items()}


def _layout(module) -> dict:
    """``{parameter name: (dtype, shape, strides, device)}``; no strides where the tensor has none
    (sparse, XLA: the layout is the compiler's)."""
    return {n: (str(p.dtype), tuple(p.shape), _strides(p), str(p.device))
            for n, p in module.named_parameters(remove_duplicate=False)}


def _strides(t) -> tuple:
    if t.device.type == "xla" or t.is_sparse:
        return ()
    try:
        return tuple(t.stride())
    except RuntimeError:  # a tensor type without strides
        return ()


def _ids(module) -> tuple:
    """``({parameter name: id}, {buffer name: id})``."""
    return ({n: id(p) for n, p in module.named_parameters(remove_duplicate=False)},
            {n: id(b) for n, b in module.named_buffers(remove_duplicate=False) if b is not None})


def _snapshot(module, own_hooks=frozenset()) -> _Snapshot:
    params, buffers = _ids(module)
    req = {n: p.requires_grad for n, p in module.named_parameters(remove_duplicate=False)}
    training = {n or "(root)": m.training for n, m in module.named_modules(remove_duplicate=False)}
    hooks = {}
    for n, m in module.named_modules(remove_duplicate=False):
        for d in _HOOK_DICTS:
            keys = tuple(k for k in getattr(m, d, {}) if k not in own_hooks)
            if keys:
                hooks[f"{n or '(root)'}.{d}"] = keys
    return _Snapshot(params, buffers, req, training, hooks, _layout(module), process_state())


def _structure(obj, depth=0):
    """A comparable description of an output: container types, keys, non-tensor members, tensor
    shapes and dtypes."""
    import torch
    if depth > 8:
        return ("deep",)
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), str(obj.dtype))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj).__qualname__, tuple((f.name, _structure(getattr(obj, f.name), depth + 1))
                                              for f in dataclasses.fields(obj)))
    if isinstance(obj, dict):
        return (type(obj).__qualname__, tuple((repr(k), _structure(v, depth + 1)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__qualname__, tuple(_structure(v, depth + 1) for v in obj))
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return ("value", repr(obj))
    return (type(obj).__qualname__,)


def _first_difference(a, b, path="output") -> str:
    if a == b:
        return ""
    if a[0] != b[0]:
        return f"{path} is {b[0]} (the module returned {a[0]})"
    if len(a) > 1 and isinstance(a[1], tuple) and isinstance(b[1], tuple) and len(a[1]) == len(b[1]):
        for i, (x, y) in enumerate(zip(a[1], b[1])):
            if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], tuple):
                d = _first_difference(x[1], y[1], f"{path}[{x[0]}]") if x[0] == y[0] else \
                    f"{path} has key {y[0]} where the module returned {x[0]}"
            else:
                d = _first_difference(x, y, f"{path}[{i}]") if isinstance(x, tuple) else ""
            if d:
                return d
    return f"{path} is {b} (the module returned {a})"


def _lay(entry) -> str:
    dtype, shape, stride, device = entry
    return f"{dtype.removeprefix('torch.')} {list(shape)} strides {list(stride)} on {device}"


class Observer:
    """The observables of one replica's module (``torch.nn.Module``, before it is wrapped), recorded
    around the DDP; every difference names replica ``rank``. ``skip``: ``{observable: reason}`` of
    those not compared (:func:`observed_wrap`), the verdict says why."""

    def __init__(self, module, rank: int, skip: dict | None = None):
        self.module, self.rank = module, rank
        self.unobserved = dict(skip or {})
        self.skip = frozenset(self.unobserved)
        self.differences: list[str] = []
        self.checked: set[str] = set()
        self._handles = []
        self._own = frozenset()
        self._inner: dict = {}
        self.before = _snapshot(module)
        self.keys = list(module.state_dict().keys())  # the wrapper's must be these under 'module.'
        self.rng = rng_digest()
        # the world's snapshot differs already: not the kit's doing (a world puts it back between
        # implementations), so this implementation's, through one of the paths FOUND_BEFORE names
        self._isolation_seen = set(isolation.changes())
        for change in sorted(self._isolation_seen):
            self._diff("process_state", f"{change} before wrapping ({FOUND_BEFORE})")

    def _diff(self, observable: str, text: str) -> None:
        if observable in self.skip:
            return
        if len(self.differences) < MAX_DIFFERENCES:
            self.differences.append(f"replica {self.rank}: {text}")

    def _see(self, *observables) -> None:
        self.checked.update(o for o in observables if o not in self.skip)

    def _compare(self, now: _Snapshot, when: str, modes=True) -> None:
        b = self.before
        self._see("parameters", "buffers", "requires_grad")
        for name, ident in b.params.items():
            if name not in now.params:
                self._diff("parameters", f"parameter '{name}' is gone {when}")
            elif now.params[name] != ident:
                self._diff("parameters", f"parameter '{name}' is a new tensor {when}")
        for name in now.params.keys() - b.params.keys():
            self._diff("parameters", f"parameter '{name}' is new {when}")
        for name, ident in b.buffers.items():
            if name not in now.buffers:
                self._diff("buffers", f"buffer '{name}' is gone {when}")
            elif now.buffers[name] != ident:
                self._diff("buffers", f"buffer '{name}' is a new tensor {when}")
        for name, req in b.requires_grad.items():
            if name in now.requires_grad and now.requires_grad[name] != req:
                self._diff("requires_grad", f"parameter '{name}' has requires_grad={now.requires_grad[name]} "
                                            f"{when} (was {req})")
        self._see("module_hooks", "layout", "process_state")
        for name, was in b.layout.items():
            if name in now.layout and now.layout[name] != was:
                self._diff("layout", f"parameter '{name}' is laid out as {_lay(now.layout[name])} {when} "
                                     f"(was {_lay(was)})")
        self._same_process(b.process, now.process, when)
        if modes:
            self._see("training")
            for name, flag in b.training.items():
                if name in now.training and now.training[name] != flag:
                    self._diff("training", f"module '{name}' has training={now.training[name]} {when} (was {flag})")
        for key in sorted(b.hooks.keys() | now.hooks.keys()):
            if b.hooks.get(key, ()) != now.hooks.get(key, ()):
                self._diff("module_hooks", f"{key} changed {when} ({len(b.hooks.get(key, ()))} hook(s) "
                                           f"before, {len(now.hooks.get(key, ()))} after)")

    def _isolation(self, when: str) -> None:
        """Name each change of the world's snapshot (:func:`conformance.worlds.isolation.changes`)
        not named before."""
        for change in isolation.changes():
            if change not in self._isolation_seen:
                self._isolation_seen.add(change)
                self._diff("process_state", f"{change} {when}")

    def wrapped(self, ddp) -> None:
        """After the DDP was constructed around :attr:`module`: compare, then hook the module."""
        self._compare(_snapshot(self.module), "after wrapping")
        self._isolation("after wrapping")
        self._see("rng", "state_dict")
        if rng_digest() != self.rng:
            self._diff("rng", "RNG state changed by the DDP's construction")
        if "state_dict" not in self.skip:
            try:
                keys = list(ddp.state_dict().keys())
            except Exception as exc:  # noqa: BLE001 - a raising state_dict is a difference
                keys = None
                self._diff("state_dict", f"the wrapper's state_dict() raised {type(exc).__name__}: {exc}")
            # a strategy that returns the module itself (no wrapper) keeps its keys
            want = self.keys if ddp is self.module else ["module." + k for k in self.keys]
            if keys is not None and keys != want:
                missing = [k for k in want if k not in keys]
                extra = [k for k in keys if k not in want]
                self._diff("state_dict", "the wrapper's state_dict keys are not the module's under 'module.' ("
                           + (f"missing {missing[:3]}" if missing else "")
                           + ("; " if missing and extra else "") + (f"extra {extra[:3]}" if extra else "")
                           + ("same keys in another order" if not missing and not extra else "") + ")")
        self.before = _snapshot(self.module)  # later differences: against what the wrap left
        if "output" not in self.skip:  # a compiled forward is left unprobed (hooks change its graph)
            self._hook()

    def _hook(self) -> None:
        def pre(mod, args, kwargs=None):
            self._inner["pre"] = rng_digest()
            self._inner["ids_pre"] = _ids(mod)
            self._inner["training"] = {n: m.training for n, m in mod.named_modules(remove_duplicate=False)}

        def post(mod, args, out):
            self._inner["post"] = rng_digest()
            self._inner["ids_post"] = ids = _ids(mod)
            self._adopt(ids)
            self._inner["out"] = _structure(out)
        self._handles = [self.module.register_forward_pre_hook(pre, prepend=True),
                         self.module.register_forward_hook(post)]
        self._own = frozenset(h.id for h in self._handles)

    def call(self, ddp, *args, **kwargs):
        """``ddp(*args, **kwargs)``, observed: the RNG state is unchanged between the call and the
        module's forward and between the module's return and the DDP's; the training flags are the
        caller's; the output has the module's structure."""
        self._inner.clear()
        flags = {n: m.training for n, m in self.module.named_modules(remove_duplicate=False)}
        rng = rng_digest()
        ids = _ids(self.module)
        state = process_state()
        try:
            out = ddp(*args, **kwargs)
        except BaseException:  # a raising forward: what it left is the module's to explain
            self._adopt(_ids(self.module))
            raise
        after = _ids(self.module)
        if "pre" in self._inner:
            self._see("rng", "output", "training")
            # the module may rebind its own tensors in its forward; the DDP may not, around it
            self._same_ids(ids, self._inner["ids_pre"], "by the DDP before the module's forward")
            self._same_ids(self._inner["ids_post"], after, "by the DDP after the module's forward")
            if self._inner["pre"] != rng:
                self._diff("rng", "RNG state changed by the DDP before the module's forward")
            if rng_digest() != self._inner["post"]:
                self._diff("rng", "RNG state changed by the DDP after the module's forward")
            if self._inner["training"] != flags:
                changed = sorted(n or "(root)" for n in flags if self._inner["training"].get(n) != flags[n])
                self._diff("training", f"the DDP's forward ran module(s) {changed[:3]} in another mode than "
                                       "the caller set")
            got = _structure(out)
            if got != self._inner["out"]:
                self._diff("output", _first_difference(self._inner["out"], got))
        if {n: m.training for n, m in self.module.named_modules(remove_duplicate=False)} != flags:
            self._diff("training", "the DDP's forward changed a module's training flag")
        self._same_process(state, process_state(), "after the DDP's forward")
        # what the step must keep: the objects the forward left (the module's own rebinding included)
        self._adopt(after)
        return out

    def forward_unseen(self) -> None:
        """The module's forward ran inside a call the observer cannot see into (a compiled
        forward+backward): the tensors it left are taken as the module's own, as :meth:`call`
        takes them after a forward."""
        self._adopt(_ids(self.module))

    def _adopt(self, ids: tuple) -> None:
        """Take ``ids`` (:func:`_ids`) as the module's own tensors: later differences are against them."""
        self.before = dataclasses.replace(self.before, params=ids[0], buffers=ids[1])

    def _same_process(self, was: dict, now: dict, when: str) -> None:
        for key, value in was.items():
            if now.get(key) != value:
                self._diff("process_state", f"{key} is {now.get(key)} {when} (was {value})")

    def _same_ids(self, was: tuple, now: tuple, when: str) -> None:
        for observable, kind, a, b in (("parameters", "parameter", was[0], now[0]),
                                       ("buffers", "buffer", was[1], now[1])):
            for name, ident in a.items():
                if name in b and b[name] != ident:
                    self._diff(observable, f"{kind} '{name}' was replaced with a new tensor {when}")

    @contextlib.contextmanager
    def unchanged_by(self, what: str):
        """A phase (backward, optimizer step) that must leave the RNG state and the process-wide
        settings as it found them."""
        rng, state = rng_digest(), process_state()
        yield
        self._see("rng", "process_state")
        if rng_digest() != rng:
            self._diff("rng", f"RNG state changed by {what}")
        self._same_process(state, process_state(), f"after {what}")

    def after_step(self, step: int, modes: bool = True) -> None:
        """After step ``step`` (1-based): the module's objects and hooks (and, with ``modes``, its
        training flags: a loop that switches modes itself passes ``False``) are still its own."""
        now = _snapshot(self.module, self._own)
        self._compare(now, f"after step {step}", modes)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def result(self) -> dict:
        """``{"differences": [...], "checked": [...]}`` (picklable: a World task returns it); what
        the run left changed in the process is named here."""
        self._isolation("after the run")
        return {"differences": list(self.differences), "checked": sorted(self.checked),
                "unobserved": dict(self.unobserved)}


def merged(observers) -> dict:
    """The :meth:`Observer.result` of several wraps of one replica (a checkpoint reload wraps
    again): every difference, the observables all of them checked."""
    results = [o.result() for o in observers]
    return {"differences": [d for r in results for d in r["differences"]][:MAX_DIFFERENCES],
            "checked": sorted(set.intersection(*(set(r["checked"]) for r in results))),
            "unobserved": results[0]["unobserved"]}


def judge_transparency(replicas: list, *, case: str = "", impl: str = "", runtime: str = "",
                       model: str = "") -> Verdict:
    """The ``transparency`` verdict over the replicas' :meth:`Observer.result` (``replicas[r]
    ["transparency"]``): fail naming the first difference, pass naming what was checked, vacuous
    when nothing was; the reason says which observables were left out, and why."""
    w = len(replicas)
    base = dict(case=case, check=TRANSPARENCY, impl=impl, runtime=runtime, model=model, world_size=w)
    results = [r.get("transparency") for r in replicas]
    if any(x is None for x in results):
        return Verdict(**base, status="skip", reason="the run recorded no observables")
    diffs = [(r, d) for r, x in enumerate(results) for d in x["differences"]]
    checked = sorted(set.intersection(*(set(x["checked"]) for x in results)))
    skipped = {k: v for x in results for k, v in x.get("unobserved", {}).items()}
    note = ("; not checked: " + "; ".join(f"{k} ({v})" for k, v in sorted(skipped.items()))) if skipped else ""
    if diffs:
        r, first = diffs[0]
        more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
        return Verdict(**base, status="fail", replica=r, reason=first + more + note,
                       diagnosis="\n".join(d for _, d in diffs))
    if not checked:
        return Verdict(**base, status="vacuous", reason="no observable was checked" + note)
    return Verdict(**base, status="pass", reason="unchanged: " + ", ".join(checked) + note)
