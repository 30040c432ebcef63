"""The module a topology (:mod:`.spec`) describes, built identically in every replica and in the
single-device oracle: torch.nn's layers (composite ones included) wired as the graph says."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from conformance.cases.scenario.dimensions import (BRANCHES, HIDDEN, IN_FEATURES, OUT_FEATURES, VOCAB, BadBatch,
                                                   structured_output)
from conformance.cases.scenario.topology.spec import INPUT_OPS, SEQ

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "complex64": torch.complex64}
#: The sequence layers' view of a node's value: ``[n, SEQ, FEATURES]``.
FEATURES = HIDDEN // SEQ


class ComplexLinear(nn.Module):
    """A complex64 weight ``[out, in]`` and bias; a real output ``Re z + Im z / 2``."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=torch.complex64))
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=torch.complex64))

    def forward(self, h):
        z = F.linear(h.to(self.weight.dtype), self.weight, self.bias)
        return z.real + 0.5 * z.imag


class FunctionalLinear(nn.Module):
    """A Linear child ``proj`` whose weights the parent reads (``F.linear``), never calling it."""

    def __init__(self, n_in, n_out, dtype):
        super().__init__()
        self.proj = nn.Linear(n_in, n_out, dtype=dtype)

    def forward(self, h):
        return F.linear(h, self.proj.weight, self.proj.bias)


class SlotLinear(nn.Module):
    """A Linear registering a ``None`` parameter slot ``bias_k`` before ``weight`` and ``bias``."""

    def __init__(self, n_in, n_out, dtype):
        super().__init__()
        self.register_parameter("bias_k", None)
        self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=dtype))

    def forward(self, h):
        return F.linear(h, self.weight, self.bias)


class FusedLinear(nn.Module):
    """A Linear whose weight rows are three parameters ``q``, ``k``, ``v``: ``.chunk(3)`` views
    of one ``[n_out, n_in]`` storage (a fused qkv weight split into parameters)."""

    def __init__(self, n_in, n_out, dtype):
        super().__init__()
        q, k, v = torch.zeros(n_out, n_in, dtype=dtype).chunk(3)
        self.q, self.k, self.v = nn.Parameter(q), nn.Parameter(k), nn.Parameter(v)
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=dtype))

    def forward(self, h):
        return F.linear(h, torch.cat([self.q, self.k, self.v]), self.bias)


class Block(nn.Module):
    """A container of one child ``inner`` (its output passed through, the first element of a
    tuple scaled by ``gain`` when the block owns that scalar parameter)."""

    def __init__(self, inner: nn.Module, own: bool, dtype):
        super().__init__()
        self.inner = inner
        self.gain = nn.Parameter(torch.ones((), dtype=dtype)) if own else None

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        if self.gain is None:
            return out
        return (out[0] * self.gain,) + tuple(out[1:]) if isinstance(out, tuple) else out * self.gain


def _transposed(lin: nn.Linear) -> nn.Linear:
    """``lin`` with its weight ``[out, in]`` held as the transpose of an ``[in, out]`` tensor."""
    lin.weight = nn.Parameter(torch.zeros(lin.in_features, lin.out_features, dtype=lin.weight.dtype).t())
    return lin


def _layer(nd: dict, dtype) -> nn.Module:
    """The layer of node ``nd`` in ``dtype`` (its layout and sparsity applied)."""
    op, kw = nd["op"], {"dtype": dtype}
    if dtype == torch.complex64:  # stem or linear
        return ComplexLinear(IN_FEATURES if op == "stem" else HIDDEN, HIDDEN)
    if nd["form"] != "module":
        n_in = IN_FEATURES if op == "stem" else HIDDEN
        if nd["form"] == "lazy":  # materialised by a dry run, before any wrapper sees it
            lazy = nn.LazyLinear(HIDDEN, dtype=dtype)
            lazy(torch.zeros(1, n_in, dtype=dtype))
            return lazy
        return {"functional": FunctionalLinear, "none_slot": SlotLinear, "fused": FusedLinear}[nd["form"]](
            n_in, HIDDEN, dtype)
    if op in ("stem", "linear"):
        lin = nn.Linear(IN_FEATURES if op == "stem" else HIDDEN, HIDDEN, **kw)
        return _transposed(lin) if nd["layout"] == "transposed" else lin
    if op in ("conv_stem", "conv2d"):
        conv = nn.Conv2d(2, HIDDEN, 2, **kw) if op == "conv_stem" else nn.Conv2d(3, 3, 3, padding=1, **kw)
        return conv.to(memory_format=torch.channels_last) if nd["layout"] == "channels_last" else conv
    build = {"embedding": lambda: nn.Embedding(VOCAB, HIDDEN, sparse=nd["sparse"], **kw),
             "embedding_bag": lambda: nn.EmbeddingBag(VOCAB, HIDDEN, mode="mean", sparse=nd["sparse"], **kw),
             "conv1d": lambda: nn.Conv1d(3, 3, 3, padding=1, **kw),
             "batchnorm": lambda: nn.BatchNorm1d(3, **kw),
             "layernorm": lambda: nn.LayerNorm(HIDDEN, **kw),
             "mha": lambda: nn.MultiheadAttention(FEATURES, 2, batch_first=True, **kw),
             "transformer": lambda: nn.TransformerEncoderLayer(FEATURES, 2, 2 * FEATURES, dropout=0.0,
                                                              batch_first=True, **kw),
             "lstm": lambda: nn.LSTM(FEATURES, FEATURES, batch_first=True, **kw),
             "gru": lambda: nn.GRU(FEATURES, FEATURES, batch_first=True, **kw)}
    return build[op]()


def _call(op: str, layout: str, layer: nn.Module, h):
    """``layer`` applied to ``h`` (``[n, IN_FEATURES]`` for a dense input layer, ``[n, INDICES]``
    int64 for an embedding, else ``[n, HIDDEN]``) -> ``[n, HIDDEN]``."""
    n = h.shape[0]
    if op == "embedding":
        return layer(h).mean(1)
    if op in ("embedding_bag", "stem", "linear", "layernorm"):
        return layer(h)
    if op in ("conv_stem", "conv2d"):
        x = h.reshape(n, 2, 2, 2) if op == "conv_stem" else h.reshape(n, 3, 2, 2)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        return layer(x).flatten(1)
    if op in ("conv1d", "batchnorm"):
        return layer(h.reshape(n, 3, HIDDEN // 3)).flatten(1)
    s = h.reshape(n, SEQ, FEATURES)
    if op == "mha":
        return layer(s, s, s, need_weights=False)[0].flatten(1)
    out = layer(s)
    return (out[0] if isinstance(out, tuple) else out).flatten(1)


class TopologyNet(nn.Module):
    """The module of topology ``t``: ``layers[str(i)]`` node ``i``'s own layer (a reused node has
    none) in its ``depth`` blocks, ``heads[k]`` output ``k``'s Linear(HIDDEN, OUT_FEATURES), with
    ``root_param`` a scalar ``logit_scale`` multiplying every output; buffers ``ema`` ``[HIDDEN]`` (a
    moving average of node 0's batch mean, 0.9/0.1) and ``count`` (int64: training forwards),
    updated in place or, with ``rebind``, by assignment of new tensors."""

    def __init__(self, t: dict, rebind: bool):
        super().__init__()
        self.t, self.rebind = t, rebind
        self.base = DTYPES[t["base"]]
        self.layers = nn.ModuleDict()
        for i, nd in enumerate(t["nodes"]):
            if nd["reuse"] is None:
                dtype = self.base if nd["dtype"] == "base" else DTYPES[nd["dtype"]]
                layer = _layer(nd, dtype)
                if nd["tie"] is not None:
                    layer.weight = _core(self.layers[str(nd["tie"])]).weight
                for d in range(nd["depth"]):  # the outermost block owns the gain
                    layer = Block(layer, nd["own"] and d == nd["depth"] - 1,
                                  torch.float32 if dtype == torch.complex64 else dtype)
                self.layers[str(i)] = layer
        self.heads = nn.ModuleList([nn.Linear(HIDDEN, OUT_FEATURES, dtype=self.base) for _ in t["outputs"]])
        if t["root_param"]:  # on the root, beside its children
            self.logit_scale = nn.Parameter(torch.ones((), dtype=self.base))
        self.register_buffer("ema", torch.zeros(HIDDEN, dtype=self.base))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.calls = 0

    def _node(self, i: int, nd: dict, vals: dict, plan):
        srcs = [vals[s] for s in nd["src"]]
        layer = self.layers[str(i if nd["reuse"] is None else nd["reuse"])]
        if nd["op"] in INPUT_OPS:
            if nd["gate"] is not None and nd["gate"] not in plan:
                return torch.zeros(srcs[0].shape[0], HIDDEN, dtype=self.base, device=srcs[0].device)
            x = srcs[0] if nd["op"] in ("embedding", "embedding_bag") else srcs[0].to(layer_dtype(layer))
            return torch.tanh(_call(nd["op"], nd["layout"], layer, x).to(self.base))
        m = srcs[0] if len(srcs) == 1 else (0.5 * (srcs[0] + srcs[1]) if nd["merge"] == "mean"
                                           else srcs[0] * srcs[1])
        if nd["gate"] is not None and nd["gate"] not in plan:
            return m
        dt = layer_dtype(layer)

        def f(h):
            return 0.5 * (h + torch.tanh(_call(nd["op"], nd["layout"], layer, h.to(dt)).to(self.base)))
        if nd["apply"] == "once":
            return f(m)
        for _ in range(2):
            m = f(m) if nd["apply"] == "twice" else checkpoint(
                f, m, use_reentrant=nd["apply"] == "checkpoint_reentrant")
        return m

    def forward(self, *xs, plan=BRANCHES, idx=None, bad=False):
        if self.t["none_input"]:  # forward(x0, mask=None, x1=None): a mask scales x0, x1 is required
            x0, mask, x1 = xs + (None,) * (3 - len(xs))
            if x1 is None:
                raise TypeError("forward(x0, mask=None, x1=None): x1 is required")
            xs = (x0 if mask is None else x0 * mask, x1)
        vals = {f"x{k}": x.to(self.base) for k, x in enumerate(xs)}
        vals["idx"] = idx
        for i, nd in enumerate(self.t["nodes"]):
            vals[i] = self._node(i, nd, vals, plan)
            if i == 0 and self.training:
                self._update_buffers(vals[0])
        if bad:  # a bad batch found mid-forward, after the statistics moved (the loop skips it)
            raise BadBatch("the topology's bad batch (bad=True): the loop skips it")
        outs = tuple(self._head(head, vals[o]) for head, o in zip(self.heads, self.t["outputs"]))
        if self.t["root_param"]:
            outs = tuple(o * self.logit_scale for o in outs)
        return self._returned(outs[0] if len(outs) == 1 else outs, vals[self.t["outputs"][0]])

    def _head(self, head: nn.Module, h):
        if self.t["head"] == "once":
            return head(h)
        return checkpoint(head, h, use_reentrant=self.t["head"] == "checkpoint_reentrant")

    def _returned(self, preds, h):
        """``preds`` in the topology's ``returns`` structure, beside the detached value ``h``."""
        if self.t["returns"] == "dataclass":
            self.calls += 1
        return structured_output(self.t["returns"], preds, h, "topology", self.calls)

    def _update_buffers(self, h):
        with torch.no_grad():
            new = 0.9 * self.ema + 0.1 * h.detach().mean(0)
            if self.rebind:  # a new object each forward: a cached buffer list goes stale
                self.ema = new
                self.count = self.count + 1
            else:
                self.ema.copy_(new)
                self.count.add_(1)


def _core(layer: nn.Module) -> nn.Module:
    """The layer inside a node's blocks."""
    while isinstance(layer, Block):
        layer = layer.inner
    return layer


def layer_dtype(layer: nn.Module):
    """The dtype a layer's input is cast to: its core's first parameter's (a complex layer casts
    itself: its real inputs stay float32)."""
    p = next(_core(layer).parameters())
    return torch.float32 if p.is_complex() else p.dtype


def build_topology(t: dict, seed: int, rebind: bool, buffer_offset: float = 0.0) -> TopologyNet:
    """The module of topology ``t`` (validated) with parameters from ``seed``: each U(-1/sqrt(fan_in),
    1/sqrt(fan_in)) (fan_in: a row's size; a norm's weight, a block's ``gain`` and the root's
    ``logit_scale`` 1 + U(-0.25, 0.25); complex: real and
    imaginary parts so drawn), in place (dtype and strides kept), a frozen node's set
    ``requires_grad=False``; every floating buffer offset by ``buffer_offset`` (rank-dependent starts).
    Inputs: ``t["inputs"]`` float32 ``[n, IN_FEATURES]`` tensors, ``idx`` int64 ``[n, INDICES]`` when a
    node reads it, ``plan`` the branches whose gated nodes run; output ``[n, OUT_FEATURES]`` per output
    (a tuple for several), in the base dtype, in the ``returns`` structure; ``bad=True`` raises
    :class:`BadBatch` after the buffers moved."""
    net = TopologyNet(t, rebind)
    gen = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for mod in net.modules():
            norm = isinstance(mod, (nn.BatchNorm1d, nn.LayerNorm, Block, TopologyNet))
            for name, p in mod.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                real = torch.view_as_real(p) if p.is_complex() else p
                bound = 0.25 if norm else 1.0 / math.sqrt(p[0].numel() if p.dim() > 1 else p.numel())
                draw = torch.empty(real.shape, dtype=torch.float64).uniform_(-bound, bound, generator=gen)
                real.copy_(draw + (1.0 if norm and name in ("weight", "gain", "logit_scale") else 0.0))
        for i, nd in enumerate(t["nodes"]):
            if nd["frozen"] and nd["reuse"] is None:
                net.layers[str(i)].requires_grad_(False)
        for b in net.buffers():
            if b.is_floating_point():
                b.add_(buffer_offset)
    return net
