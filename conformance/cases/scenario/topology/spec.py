"""The topology format: the JSON data of one generated module graph, its tables of layers and
corners, its validation (one line naming the first bad value) and how a verdict names it.

A topology is ``{"base": dtype, "inputs": 1|2, "nodes": [node, ...], "outputs": [node index, ...],
"root_param": bool, "none_input": bool, "returns": structure, "head": apply}``: ``root_param`` a
scalar parameter ``logit_scale`` registered on the root module beside its children (CLIP's ``logit_scale``, a ViT's ``cls_token``)
scaling every output; ``none_input`` (two inputs only) the forward is ``forward(x0, mask=None,
x1=None)`` called as ``(x0, None, x1)``: a positional ``None`` for a middle optional argument;
``returns`` (:data:`RETURNS`) the structure the forward returns its predictions in; ``head``
(:data:`HEAD_APPLY`) how the output heads are applied (under activation checkpointing: the last
layers' gradients are then computed inside the checkpoint's own backward).
Every node computes a ``[n, HIDDEN]`` value from its sources (``src``): ``"x0"`` / ``"x1"`` (the
dense inputs, ``[n, IN_FEATURES]``), ``"idx"`` (the int64 indices ``[n, INDICES_PER_SAMPLE]``) or an
earlier node's index; several sources merge (``merge``: their mean, or their product). A node:

* ``op``: its layer (:data:`INPUT_OPS` read an input, :data:`HIDDEN_OPS` a node's value);
* ``gate``: ``null`` or a branch of :data:`~..dimensions.BRANCHES`: the node runs only when the
  replica's plan holds it (else it passes its merged value through, an input node gives zeros):
  the scenario's rank-dependent control flow and unused parameters, anywhere in the graph;
* ``dtype`` (:data:`NODE_DTYPES`, ``"base"``: the topology's), ``layout`` (:data:`LAYOUTS`),
  ``sparse`` (an embedding's gradient), ``apply`` (:data:`APPLY`: once, twice, twice under
  (non-)reentrant activation checkpointing), ``frozen`` (``requires_grad=False``);
* ``reuse``: ``null`` or an earlier node of the same ``op`` whose module this node applies (one
  module applied at two places of the graph); ``tie``: ``null`` or an earlier node whose weight
  this node's layer shares (tied parameters, two modules);
* ``depth`` (0..:data:`MAX_DEPTH`): the layer sits inside that many nested container blocks (blocks
  of blocks; the root holds it at level 2 already); ``own``: the outermost block registers a scalar
  parameter ``gain`` of its own beside its child (parameters on a module that has children);
* ``form`` (:data:`FORMS`, for :data:`FORM_OPS`): how a Linear's parameters are held: a module;
  its weights read by the parent (``F.linear(h, self.proj.weight, self.proj.bias)``, as
  nn.MultiheadAttention reads ``out_proj``); a ``None`` parameter slot registered before the real
  ones (MHA's ``bias_k``); three parameters that are ``.chunk(3)`` views of one fused storage (a
  fused qkv weight); an ``nn.LazyLinear`` materialised by a dry run before wrapping.

The outputs are node indices; the module computes one ``[n, OUT_FEATURES]`` prediction per output
(a tensor for one, a tuple for several; the loss reads their sum), each through its own head, and
returns them as they are (``returns`` ``tensor``) or as the ``pred`` of a dict, a dataclass or a
namedtuple beside a detached hidden value (the scenario model's output structures,
:data:`~..dimensions.MODULES` ``output``).
"""
from __future__ import annotations

from conformance.cases.scenario.dimensions import BRANCHES, MODULES

#: Layers that read an input: ``stem`` Linear(IN_FEATURES, HIDDEN), ``conv_stem`` Conv2d(2, HIDDEN,
#: 2) over ``x`` seen as ``[n, 2, 2, 2]``, ``embedding`` Embedding(VOCAB, HIDDEN) (lookups averaged),
#: ``embedding_bag`` EmbeddingBag(VOCAB, HIDDEN, mode="mean").
INPUT_OPS = ("stem", "conv_stem", "embedding", "embedding_bag")
#: Layers of a node's value ``[n, HIDDEN]``; the sequence layers see it as ``[n, SEQ, HIDDEN // SEQ]``
#: (batch first), the conv layers as ``[n, 3, 4]`` / ``[n, 3, 2, 2]``.
HIDDEN_OPS = ("linear", "conv1d", "conv2d", "batchnorm", "layernorm", "mha", "transformer", "lstm", "gru")
OPS = INPUT_OPS + HIDDEN_OPS
SEQ = 3
MERGES = ("mean", "mul")
BASE_DTYPES = ("float32", "float64")
NODE_DTYPES = ("base", "float64", "bfloat16", "complex64")
#: The layers each non-base dtype is drawn for (complex: a complex Linear with a real output).
DTYPE_OPS = {"float64": OPS, "bfloat16": ("stem", "linear", "conv1d", "conv2d"), "complex64": ("stem", "linear")}
#: Layouts of a node's weight and the layers that have it: a transposed (strided) Linear weight, a
#: channels_last 4-d conv weight.
LAYOUTS = ("contiguous", "transposed", "channels_last")
LAYOUT_OPS = {"transposed": ("stem", "linear"), "channels_last": ("conv_stem", "conv2d")}
SPARSE_OPS = ("embedding", "embedding_bag")
#: How a node applies its layer: once; twice in a row (each adding half); twice, each under
#: activation checkpointing (``torch.utils.checkpoint``, non-reentrant or reentrant).
APPLY = ("once", "twice", "checkpoint_nonreentrant", "checkpoint_reentrant")
#: How the output heads are applied: plainly, or each under activation checkpointing.
HEAD_APPLY = ("once", "checkpoint_nonreentrant", "checkpoint_reentrant")
#: The structure a topology's forward returns its predictions in (the plain one first).
RETURNS = MODULES["output"]
#: Layers whose forward updates buffers (never under activation checkpointing).
BUFFER_OPS = ("batchnorm",)
#: Layers whose weight a later node of the same layer may tie (same shape).
TIE_OPS = ("linear", "embedding", "embedding_bag")
#: The most container blocks a node's layer is nested in.
MAX_DEPTH = 3
#: How a Linear holds its parameters (spec's ``form``), the plain one first; the layers that have them.
FORMS = ("module", "functional", "none_slot", "fused", "lazy")
FORM_OPS = ("stem", "linear")
NODE_KEYS = {"op", "src", "merge", "gate", "dtype", "layout", "sparse", "apply", "reuse", "tie", "frozen", "depth",
             "own", "form"}
TOPOLOGY_KEYS = {"base", "inputs", "nodes", "outputs", "root_param", "none_input", "returns", "head"}
#: The most nodes a topology holds (drawn or replayed).
MAX_NODES = 12


class TopologyError(ValueError):
    """A topology that does not parse or names an unknown value; one line."""


def node(op: str, src: list, **kw) -> dict:
    """A node with every key, its defaults the plain corner (``kw`` overrides)."""
    return dict({"op": op, "src": list(src), "merge": "mean", "gate": None, "dtype": "base",
                 "layout": "contiguous", "sparse": False, "apply": "once", "reuse": None, "tie": None,
                 "frozen": False, "depth": 0, "own": False, "form": "module"}, **kw)


def validate_topology(t) -> None:
    """Raises :class:`TopologyError` naming the first bad value of topology ``t``."""
    if not isinstance(t, dict) or set(t) != TOPOLOGY_KEYS:
        raise TopologyError(f"topology: an object with keys {sorted(TOPOLOGY_KEYS)}")
    if t["base"] not in BASE_DTYPES:
        raise TopologyError(f"topology base {t['base']!r}: one of {BASE_DTYPES}")
    if t["inputs"] not in (1, 2):
        raise TopologyError(f"topology inputs {t['inputs']!r}: 1 or 2 dense inputs")
    if not isinstance(t["root_param"], bool) or not isinstance(t["none_input"], bool):
        raise TopologyError("topology root_param, none_input: true or false")
    if t["none_input"] and t["inputs"] != 2:
        raise TopologyError("topology none_input: only with 2 inputs (the None sits between them)")
    if t["returns"] not in RETURNS:
        raise TopologyError(f"topology returns {t['returns']!r}: one of {RETURNS}")
    if t["head"] not in HEAD_APPLY:
        raise TopologyError(f"topology head {t['head']!r}: one of {HEAD_APPLY}")
    nodes = t["nodes"]
    if not isinstance(nodes, list) or not 1 <= len(nodes) <= MAX_NODES:
        raise TopologyError(f"topology nodes: a list of 1..{MAX_NODES} nodes")
    refs = {f"x{i}" for i in range(t["inputs"])} | {"idx"}
    for i, nd in enumerate(nodes):
        _validate_node(i, nd, nodes, refs)
    outs = t["outputs"]
    if (not isinstance(outs, list) or not outs or len(set(outs)) != len(outs)
            or any(not isinstance(o, int) or isinstance(o, bool) or not 0 <= o < len(nodes) for o in outs)):
        raise TopologyError(f"topology outputs {outs!r}: distinct node indices, at least one")
    for i, nd in enumerate(nodes):
        if nd["sparse"] and (nd["gate"] is not None or i not in outs):
            raise TopologyError(f"topology node {i}: a sparse node is ungated and an output (torch's DDP raises "
                                "'Expected sparse gradient to be defined' when a backward leaves a sparse "
                                "parameter unused)")
    if t["head"] == "checkpoint_reentrant":
        dead_ends = [o for o in outs if not needs_grad(nodes, o)]
        if dead_ends:
            raise TopologyError(f"topology head checkpoint_reentrant: output node(s) {dead_ends} hold no value that "
                                "needs grad (frozen layers on the inputs only), so a reentrant checkpoint would give "
                                "their heads no gradient")
    consumed = {s for nd in nodes for s in nd["src"] if isinstance(s, int)} | set(outs)
    dead = [i for i in range(len(nodes)) if i not in consumed]
    if dead:  # a node no output reads trains nothing on any replica (not a plan's choice)
        raise TopologyError(f"topology node(s) {dead}: read by no node and no output")


def needs_grad(nodes: list, i: int) -> bool:
    """Whether node ``i``'s value needs grad when every gate is open: its layer is trainable or
    one of its sources' values needs grad (the inputs never do)."""
    nd = nodes[i]
    return not nd["frozen"] or any(needs_grad(nodes, s) for s in nd["src"] if isinstance(s, int))


def _validate_node(i: int, nd, nodes: list, refs: set) -> None:
    where = f"topology node {i}"
    if not isinstance(nd, dict) or set(nd) != NODE_KEYS:
        raise TopologyError(f"{where}: an object with keys {sorted(NODE_KEYS)}")
    op = nd["op"]
    if op not in OPS:
        raise TopologyError(f"{where}: op {op!r}: one of {OPS}")
    src = nd["src"]
    if not isinstance(src, list) or not 1 <= len(src) <= 2 or len(set(map(str, src))) != len(src):
        raise TopologyError(f"{where}: src: one or two distinct sources")
    for s in src:
        ok = (s in refs and op in INPUT_OPS) if isinstance(s, str) else (
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < i and op in HIDDEN_OPS)
        if not ok:
            raise TopologyError(f"{where}: source {s!r}: an input layer reads one input "
                                f"({sorted(refs)}), a hidden layer earlier nodes (0..{i - 1})")
    if op in INPUT_OPS and (len(src) != 1 or (src[0] == "idx") != (op in SPARSE_OPS)):
        raise TopologyError(f"{where}: {op} reads {'idx' if op in SPARSE_OPS else 'one dense input'}")
    if nd["merge"] not in MERGES:
        raise TopologyError(f"{where}: merge {nd['merge']!r}: one of {MERGES}")
    if nd["gate"] is not None and nd["gate"] not in BRANCHES:
        raise TopologyError(f"{where}: gate {nd['gate']!r}: null or one of {BRANCHES}")
    if nd["dtype"] not in NODE_DTYPES or (nd["dtype"] != "base" and op not in DTYPE_OPS[nd["dtype"]]):
        raise TopologyError(f"{where}: dtype {nd['dtype']!r}: 'base' or one whose layers hold {op!r} "
                            f"({DTYPE_OPS})")
    if nd["layout"] not in LAYOUTS or (nd["layout"] != "contiguous" and op not in LAYOUT_OPS[nd["layout"]]):
        raise TopologyError(f"{where}: layout {nd['layout']!r}: 'contiguous' or one whose layers hold {op!r} "
                            f"({LAYOUT_OPS})")
    if not isinstance(nd["sparse"], bool) or (nd["sparse"] and op not in SPARSE_OPS):
        raise TopologyError(f"{where}: sparse: true only for {SPARSE_OPS}")
    if nd["apply"] not in APPLY or (nd["apply"] != "once" and op in INPUT_OPS):
        raise TopologyError(f"{where}: apply {nd['apply']!r}: one of {APPLY} ('once' for an input layer)")
    if nd["apply"].startswith("checkpoint") and op in BUFFER_OPS:
        raise TopologyError(f"{where}: a {op} is not checkpointed (its recomputation in backward would move its "
                            "buffers again, after the forward the DDP's buffer rule sees)")
    if not isinstance(nd["frozen"], bool):
        raise TopologyError(f"{where}: frozen: true or false")
    d = nd["depth"]
    if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= MAX_DEPTH:
        raise TopologyError(f"{where}: depth {d!r}: 0..{MAX_DEPTH} nested blocks")
    if not isinstance(nd["own"], bool) or (nd["own"] and d == 0):
        raise TopologyError(f"{where}: own: true or false, true only inside a block (depth >= 1)")
    if nd["form"] not in FORMS or (nd["form"] != "module" and (
            op not in FORM_OPS or nd["dtype"] not in ("base", "float64") or nd["layout"] != "contiguous")):
        raise TopologyError(f"{where}: form {nd['form']!r}: 'module' or one of {FORMS} for a real, contiguous "
                            f"{' / '.join(FORM_OPS)}")
    for key in ("reuse", "tie"):
        k = nd[key]
        if k is None:
            continue
        if not (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < i):
            raise TopologyError(f"{where}: {key} {k!r}: null or an earlier node")
        other = nodes[k]
        if other["op"] != op or other["reuse"] is not None:
            raise TopologyError(f"{where}: {key} {k}: a node of the same op ({op}) with its own module")
        same = ("dtype", "layout", "sparse", "frozen", "form")
        if any(other[f] != nd[f] for f in same):
            raise TopologyError(f"{where}: {key} {k}: the same {', '.join(same)}")
    if nd["tie"] is not None and (op not in TIE_OPS or nd["reuse"] is not None or nd["form"] != "module"):
        raise TopologyError(f"{where}: tie: only {TIE_OPS} of form 'module', and not with reuse")


def needs(t: dict) -> dict:
    """What a topology asks of the scenario around it: ``sparse`` (a sparse gradient: SGD-type
    optimizers), ``reentrant`` (a layer applied twice under reentrant checkpoints: upstream DDP
    needs ``static_graph``), ``reentrant_head`` (the heads under one reentrant checkpoint each:
    upstream needs ``static_graph`` with ``find_unused_parameters`` only),
    ``idx`` (the indices input), ``bf16`` (a bfloat16 layer: the mixed tolerance, short runs),
    ``tolerance`` (the tolerance row: ``float64`` only for an all-float64 topology)."""
    nodes = t["nodes"]
    bf16 = any(nd["dtype"] == "bfloat16" for nd in nodes)
    narrow = any(nd["dtype"] in ("bfloat16", "complex64") for nd in nodes) or t["base"] == "float32"
    return {"sparse": any(nd["sparse"] for nd in nodes), "bf16": bf16,
            "reentrant": any(nd["apply"] == "checkpoint_reentrant" for nd in nodes),
            "reentrant_head": t["head"] == "checkpoint_reentrant",
            "idx": any(nd["op"] in SPARSE_OPS for nd in nodes),
            "tolerance": "bf16-mixed" if bf16 else "float32" if narrow else "float64"}


def corners(t: dict) -> list[str]:
    """The corners topology ``t`` holds, as phrases (sorted, each once): what :func:`describe` and
    the docs' corner x topology map name."""
    out = set()
    if t["base"] == "float64":
        out.add("float64 model")
    if t["inputs"] == 2:
        out.add("two inputs")
    if len(t["outputs"]) > 1:
        out.add("several outputs")
    if t["root_param"]:
        out.add("parameter on the root")
    if t["none_input"]:
        out.add("positional None input")
    if t["returns"] != RETURNS[0]:
        out.add(f"predictions returned in a {t['returns']}")
    if t["head"] != HEAD_APPLY[0]:
        out.add(f"heads applied under {t['head'].replace('_', ' ')}")
    for nd in t["nodes"]:
        if len(nd["src"]) > 1:
            out.add(f"merge ({nd['merge']})")
        if nd["gate"] is not None:
            out.add("gated node (rank-dependent / unused)")
        if nd["dtype"] not in ("base", t["base"]):
            out.add(f"{nd['dtype']} layer")
        if nd["layout"] != "contiguous":
            out.add(f"{nd['layout']} weight")
        if nd["sparse"]:
            out.add(f"sparse gradient ({nd['op']})")
        if nd["apply"] != "once":
            out.add(f"applied {nd['apply'].replace('_', ' ')}")
        if nd["reuse"] is not None:
            out.add("module reused at two places")
        if nd["tie"] is not None:
            out.add("tied weight")
        if nd["frozen"]:
            out.add("frozen layer")
        if nd["depth"] > 0:
            out.add(f"nested {nd['depth'] + 2} levels deep" + (" (buffers)" if nd["op"] in BUFFER_OPS else ""))
        if nd["own"]:
            out.add("parameter on a block with children")
        if nd["form"] != "module":
            out.add({"functional": "weights read by the parent", "none_slot": "None parameter slot first",
                     "fused": "parameters viewing one storage", "lazy": "lazy layer"}[nd["form"]])
    return sorted(out)


def describe(t: dict) -> str:
    """``topology: <n> nodes (<ops>) -> <k> output(s); <corners>`` for verdict reasons."""
    ops = ", ".join(f"{i}:{nd['op']}<-{nd['src']}" for i, nd in enumerate(t["nodes"]))
    cs = corners(t)
    return (f"topology: {len(t['nodes'])} node(s) ({ops}) -> outputs {t['outputs']}"
            + (f"; {', '.join(cs)}" if cs else ""))
