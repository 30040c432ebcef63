"""The scenario model and its data, built identically in every replica and in the oracle."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.checkpoint import checkpoint

from conformance.cases.scenario.topology import build_topology, needs

from conformance.cases.scenario.dimensions import (BRANCHES, BadBatch, GRAD_HOOK_PARAM, GRAD_HOOK_SCALE, HIDDEN,
                                                   INDICES_PER_SAMPLE, IN_FEATURES, KW_SCALE, OUT_FEATURES,
                                                   PLAIN_MODULE, PLAIN_WORKLOAD, VOCAB, structured_output)


def user_grad_hook(net, module: dict | None) -> None:
    """With ``module["grad_hook"] == "after_wrap"``, register the user's gradient hook
    (:data:`~.dimensions.GRAD_HOOK_PARAM`) on ``net``: the replicas after wrapping, the reference
    after building (torch's DDP reduces what accumulated into ``.grad``, after the tensor's hooks)."""
    if dict(PLAIN_MODULE, **(module or {}))["grad_hook"] == "after_wrap":
        dict(net.named_parameters())[GRAD_HOOK_PARAM].register_hook(lambda g: g * GRAD_HOOK_SCALE)


# --- the layers of the workload's corners ---------------------------------------------------------

class LowPrecisionLinear(nn.Linear):
    """A Linear in a lower dtype (bfloat16) between float layers: input cast down, output back."""

    def forward(self, h):
        return super().forward(h.to(self.weight.dtype)).to(h.dtype)


class ComplexLinear(nn.Module):
    """A complex64 weight [out, in] and bias; a real output ``Re z + Im z / 2`` (only the
    matmul is complex: torch_xla's complex tanh backward differs from CPU's)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=torch.complex64))
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=torch.complex64))

    def forward(self, h):
        z = F.linear(h.to(self.weight.dtype), self.weight, self.bias)
        return (z.real + 0.5 * z.imag).to(h.dtype)


class ConvStem(nn.Module):
    """The stem as a 2x2 conv over ``x`` seen as ``[n, 2, 2, 2]`` (the same map as a Linear),
    its weight ``[HIDDEN, 2, 2, 2]`` in ``channels_last`` memory format."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, HIDDEN, 2).to(memory_format=torch.channels_last)

    def forward(self, x):
        return self.conv(x.reshape(-1, 2, 2, 2).contiguous(memory_format=torch.channels_last)).flatten(1)


class Symmetric(nn.Module):
    """Parametrization ``W = triu(X) + triu(X, 1)^T`` (square ``X``)."""

    def forward(self, X):
        return X.triu() + X.triu(1).transpose(0, 1)


def _branch_layer(b: str, dtype: str):
    """Branch ``b``'s layer for workload dtype ``dtype`` (branch ``b`` carries the dtype corners)."""
    if b == "b" and dtype == "complex64":
        return ComplexLinear(HIDDEN, HIDDEN)
    if b == "b" and dtype == "bfloat16":
        return LowPrecisionLinear(HIDDEN, HIDDEN, dtype=torch.bfloat16)
    return nn.Linear(HIDDEN, HIDDEN)


# --- the model ------------------------------------------------------------------------------------

class ScenarioNet(nn.Module):
    """The scenario model of workload ``wl`` and module ``md`` (both complete: every dimension
    named; :func:`build_scenario_model` says what each changes)."""

    def __init__(self, wl: dict, md: dict, rebind: bool, buffer_offset: float):
        super().__init__()
        self.wl, self.md = wl, md
        self.stem = ConvStem() if wl["layout"] == "channels_last" else nn.Linear(IN_FEATURES, HIDDEN)
        self.branch = nn.ModuleDict({b: _branch_layer(b, wl["dtype"]) for b in BRANCHES})
        self.head = nn.Linear(HIDDEN, OUT_FEATURES)
        if wl["layout"] == "transposed":  # [OUT, HIDDEN] with strides (1, OUT)
            self.head.weight = nn.Parameter(torch.zeros(HIDDEN, OUT_FEATURES).t())
        if wl["graph"] == "shared":
            self.branch["c"].weight = self.branch["a"].weight
        if wl["grad"] == "sparse":
            self.emb = nn.Embedding(VOCAB, HIDDEN, sparse=True)
        elif wl["grad"] == "sparse_bag":
            self.emb = nn.EmbeddingBag(VOCAB, HIDDEN, mode="mean", sparse=True)
        self.register_buffer("ema", torch.zeros(HIDDEN), persistent=md["buffers"] == "persistent")
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        if md["int_buffer"] == "samples":
            self.register_buffer("seen", torch.full((), seen_start(buffer_offset), dtype=torch.int64))
        if md["params"] == "containers":
            self.gains = nn.ParameterList([nn.Parameter(torch.ones(HIDDEN)) for _ in range(2)])
            self.offsets = nn.ParameterDict({"h": nn.Parameter(torch.zeros(HIDDEN)),
                                             "out": nn.Parameter(torch.zeros(OUT_FEATURES))})
        self.rebind = rebind
        self.calls = 0

    def _branch(self, b, h):
        graph = self.wl["graph"]
        if graph in ("plain", "shared"):
            return h + torch.tanh(self.branch[b](h))
        # Applied twice, each application adding half: the model is no deeper in effect than the
        # plain one (at full weight an SGD run's steps grow until float32 rounding exceeds the bound).
        fn = (lambda t: 0.5 * torch.tanh(self.branch[b](t)))
        for _ in range(2):  # applied twice; each under its own checkpoint if so drawn
            if graph == "applied_twice":
                h = h + fn(h)
                continue
            reentrant = graph == "checkpoint_reentrant"
            ckpt = checkpoint
            if h.device.type == "xla":  # torch.utils.checkpoint looks up torch.xla (torch 2.9)
                from torch_xla.utils.checkpoint import checkpoint as ckpt  # reentrant only
            h = h + ckpt(fn, h, use_reentrant=reentrant)
        return h

    def _update_buffers(self, h, n: int):
        """A training forward's buffer updates (rebound or in place); returns the hidden layer,
        centred on the updated ``ema`` when it feeds the output."""
        md = self.md
        with torch.no_grad():
            new = 0.9 * self.ema + 0.1 * h.detach().mean(0)
            if self.rebind:  # a new object each forward: a cached buffer list goes stale
                self.ema = new
                self.count = self.count + 1
                if md["int_buffer"] == "samples":
                    self.seen = self.seen + n
            else:
                self.ema.copy_(new)
                self.count.add_(1)
                if md["int_buffer"] == "samples":
                    self.seen.add_(n)
        if md["buffer_use"] == "centre":  # ema feeds the output; a subtraction saves nothing
            h = h - self.ema.to(h.dtype)
        return h

    def _output(self, out, h):
        """The forward's output in the module's ``output`` structure."""
        if self.md["output"] == "dataclass":
            self.calls += 1  # a host int (reading ``count`` would run the graph on XLA)
        return structured_output(self.md["output"], out, h, "scenario", self.calls)

    def forward(self, x, plan=BRANCHES, idx=None, *, scale=1.0, mask=None, bad=False):
        md = self.md
        x = x.to(self.head.weight.dtype)
        pre = self.stem(x)
        if idx is not None:
            e = self.emb(idx)
            pre = pre + (e.mean(1) if e.dim() == 3 else e)
        if md["params"] == "containers":
            pre = pre * self.gains[0] + self.offsets["h"]
        h = torch.tanh(pre) * scale
        if mask is not None:
            h = h * mask.to(h.dtype).unsqueeze(1)
        if self.training:
            h = self._update_buffers(h, x.shape[0])
        elif md["buffer_use"] == "centre":  # eval mode reads the statistics (BatchNorm's running stats)
            h = h - self.ema.to(h.dtype)
        if bad:  # a bad batch found mid-forward, after the statistics moved (the loop skips it)
            raise BadBatch("the scenario's bad batch (bad=True): the loop skips it")
        for b in plan:
            h = self._branch(b, h)
        if md["params"] == "containers":
            h = h * self.gains[1]
        out = self.head(h)
        if md["params"] == "containers":
            out = out + self.offsets["out"]
        return self._output(out, h)


def build_scenario_model(seed: int, rebind: bool, buffer_offset: float = 0.0, workload: dict | None = None,
                         module: dict | None = None, topology: dict | None = None):
    """``stem -> h; h + sum over the plan's branches (in plan order) of tanh(branch(h)) -> head``.

    Parameters U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from ``seed`` (fan_in of a conv or
    embedding weight: its first row's size; complex: real and imaginary parts so drawn);
    buffers ``ema`` (``[HIDDEN]``: moving average of the stem's batch mean, 0.9/0.1, offset by
    ``buffer_offset``: rank-dependent starts) and ``count`` (int64 scalar: training forwards),
    updated in training forward by assignment of new tensors when ``rebind`` else in place.
    Inputs ``x`` float32 ``[n, IN_FEATURES]`` and, for a sparse workload, ``idx`` int64
    ``[n, INDICES_PER_SAMPLE]``; output ``[n, OUT_FEATURES]`` (float64 for the float64 workload,
    else float32) in ``module``'s structure; ``bad=True`` raises :class:`BadBatch` after the
    buffers' update. ``workload`` (:data:`~.dimensions.WORKLOADS`) and ``module``
    (:data:`~.dimensions.MODULES`; a parametrization registered after initialisation, container
    parameters drawn from ``seed``) default to the plain ones. A ``topology`` (:mod:`.topology`)
    builds its module graph instead (:func:`~.topology.build_topology`).
    """
    if topology is not None:
        return build_topology(topology, seed, rebind, buffer_offset)
    wl = dict(PLAIN_WORKLOAD, **(workload or {}))
    md = dict(PLAIN_MODULE, **(module or {}))
    net = ScenarioNet(wl, md, rebind, buffer_offset)
    if md["hook"] == "pre_hook":
        net.register_forward_pre_hook(lambda mod, args: (args[0] * 0.5,) + tuple(args[1:]))
    _initialise(net, seed, wl, md, buffer_offset)
    if md["parametrize"] == "symmetric":
        parametrize.register_parametrization(net.branch["a"], "weight", Symmetric())
    elif md["parametrize"] == "weight_norm":
        weight_norm(net.head)
    return net


def _initialise(net: ScenarioNet, seed: int, wl: dict, md: dict, buffer_offset: float) -> None:
    """Draw ``net``'s parameters from ``seed`` (:func:`build_scenario_model`), cast a float64
    workload's model, offset ``ema`` by ``buffer_offset``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, nn.Linear):
                bound = 1.0 / math.sqrt(mod.in_features)
                mod.weight.uniform_(-bound, bound, generator=gen)
                mod.bias.uniform_(-bound, bound, generator=gen)
            elif isinstance(mod, (nn.Conv2d, nn.Embedding, nn.EmbeddingBag, ComplexLinear)):
                for p in mod.parameters(recurse=False):  # in place: dtype and strides kept
                    real = torch.view_as_real(p) if p.is_complex() else p
                    bound = 1.0 / math.sqrt(p[0].numel() if p.dim() > 1 else p.numel())
                    real.copy_(torch.empty(real.shape, dtype=torch.float64).uniform_(-bound, bound, generator=gen))
        if md["params"] == "containers":  # gains 1 + U(-0.25, 0.25), offsets U(-0.25, 0.25)
            for p in net.gains:
                p.add_(torch.empty(p.shape).uniform_(-0.25, 0.25, generator=gen).to(p.dtype))
            for p in net.offsets.values():
                p.copy_(torch.empty(p.shape).uniform_(-0.25, 0.25, generator=gen).to(p.dtype))
        if wl["dtype"] == "float64":
            net.double()  # parameters and ema; strides kept
        net.ema.add_(buffer_offset)


def seen_start(buffer_offset: float) -> int:
    """Where the int64 buffer ``seen`` starts for a replica built with ``buffer_offset``
    (rank-dependent: only a DDP that broadcasts integer buffers at construction aligns it)."""
    return int(round(10 * buffer_offset))


def scenario_mask(seed: int, step: int, micro: int, rank: int, n: int):
    """The ``mask=`` keyword (``module["kwargs"] == "mask"``): float32 ``[n]`` of 0/1, sample 0
    always kept, from (seed, step, micro, rank) apart from :func:`scenario_batch`'s draw."""
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 101 + micro) * 257 + rank + 13)
    m = (torch.rand(n, generator=gen) < 0.7).float()
    m[0] = 1.0
    return m


def forward_kwargs(module: dict, seed: int, step: int, micro: int, rank: int, n: int) -> dict:
    """The keywords of a forward on micro-batch ``(step, micro)`` of replica ``rank`` (``n``
    samples) for ``module["kwargs"]``: ``{}``, ``{"scale": KW_SCALE}`` or ``{"mask": ...}``."""
    kind = module.get("kwargs", "none")
    if kind == "scale":
        return {"scale": KW_SCALE}
    if kind == "mask":
        return {"mask": scenario_mask(seed, step, micro, rank, n)}
    return {}


def scenario_inputs(sc, s: int, j: int, r: int, sizes, plan, device=None) -> tuple:
    """``((x,), keywords, y)`` of replica ``r``'s forward on micro-batch ``(s, j)`` of scenario
    ``sc`` (``sizes``: every replica's local batch size; ``plan`` None: a forward without backward,
    on the module's default plan), the tensors on ``device`` when given."""
    n = sizes[r]
    x, y = scenario_batch(sc.seed, s, j, r, n)
    xs = (x,)
    kwargs = {} if plan is None else {"plan": plan}
    topo = needs(sc.topology) if sc.topology is not None else {"idx": False}
    if sc.workload["grad"] != "dense" or topo["idx"]:
        kwargs["idx"] = scenario_indices(sc.seed, s, j, r, n)
    if sc.topology is not None and sc.topology["inputs"] == 2:  # a second input, drawn apart
        xs += (scenario_batch(sc.seed + TOPOLOGY_SECOND_INPUT, s, j, r, n)[0],)
        if sc.topology["none_input"]:  # forward(x0, mask=None, x1=None) called as (x0, None, x1)
            xs = (xs[0], None, xs[1])
    kwargs.update(forward_kwargs(sc.module, sc.seed, s, j, r, n))  # MODULES "kwargs"
    if device is not None:
        xs, y = tuple(None if t is None else t.to(device) for t in xs), y.to(device)
        kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return xs, kwargs, y


#: A topology's second dense input: the data of seed ``seed + TOPOLOGY_SECOND_INPUT``.
TOPOLOGY_SECOND_INPUT = 7919


def scenario_batch(seed: int, step: int, micro: int, rank: int, n: int):
    """``(x [n, IN_FEATURES], y [n, OUT_FEATURES])`` float32 N(0, 1), from (seed, step, micro, rank)."""
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 101 + micro) * 257 + rank)
    return torch.randn(n, IN_FEATURES, generator=gen), torch.randn(n, OUT_FEATURES, generator=gen)


def scenario_indices(seed: int, step: int, micro: int, rank: int, n: int):
    """``idx`` int64 ``[n, INDICES_PER_SAMPLE]`` in ``[0, VOCAB)`` (the sparse corner's embedding
    lookups), from (seed, step, micro, rank) apart from :func:`scenario_batch`'s draw."""
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 101 + micro) * 257 + rank + 7)
    return torch.randint(0, VOCAB, (n, INDICES_PER_SAMPLE), generator=gen)
