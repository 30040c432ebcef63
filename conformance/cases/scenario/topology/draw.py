"""The Hypothesis strategy of topologies (:mod:`.spec`): every choice's first value is the plain
one, so a failing topology shrinks to the fewest nodes and corners that still fail (one dense
input, a stem, one Linear, one output)."""
from __future__ import annotations

from conformance.cases.scenario.dimensions import BRANCHES
from conformance.cases.scenario.topology.spec import (BASE_DTYPES, BUFFER_OPS, DTYPE_OPS, FORM_OPS, HIDDEN_OPS,
                                                      LAYOUT_OPS, RETURNS, SPARSE_OPS, TIE_OPS, needs_grad, node)

#: Corner odds of one node, as ``(value, weight)`` in shrink order (the first is the plain one):
#: weights of integers drawn 0..sum-1, so each corner shows in a fair share of nodes.
DTYPE_ODDS = (("base", 6), ("float64", 2), ("bfloat16", 1), ("complex64", 2))
APPLY_ODDS = (("once", 6), ("twice", 1), ("checkpoint_nonreentrant", 1), ("checkpoint_reentrant", 1))
GATE_ODDS = ((None, 3),) + tuple((b, 1) for b in BRANCHES)
DEPTH_ODDS = ((0, 5), (1, 2), (2, 1), (3, 1))
FORM_ODDS = (("module", 3), ("fused", 2), ("functional", 1), ("none_slot", 1), ("lazy", 1))
HEAD_ODDS = (("once", 3), ("checkpoint_reentrant", 2), ("checkpoint_nonreentrant", 1))
RETURNS_ODDS = tuple((v, 2 if v in ("tensor", "dataclass") else 1) for v in RETURNS)


def _weighted(draw, odds, allowed=lambda v: True):
    """One value of ``odds`` among the ``allowed`` ones (the plain one is always allowed)."""
    from hypothesis import strategies as st
    odds = [(v, w) for v, w in odds if v == odds[0][0] or allowed(v)]
    k = draw(st.integers(0, sum(w for _, w in odds) - 1))
    for v, w in odds:
        if k < w:
            return v
        k -= w
    return odds[0][0]


def topologies(max_hidden: int = 6, reentrant: bool = True, gates: bool = True):
    """Strategy of topologies: 1-2 dense inputs each read by a stem (Linear or channels_last-able
    Conv2d), maybe an Embedding(Bag) on the indices, ``1..max_hidden`` hidden nodes of
    :data:`~.spec.HIDDEN_OPS` each reading one or two earlier nodes, every corner of :mod:`.spec`
    drawn per node (nesting depth, a block's own parameter, a Linear's form included), a root
    parameter, a positional ``None`` input, the output structure and the heads' checkpointing per
    topology; the outputs are the nodes no other reads, plus maybe one more. ``reentrant``:
    reentrant checkpoints may be drawn (upstream DDP needs ``static_graph`` for them); ``gates``:
    nodes may be gated by a plan's branch."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        base = draw(st.sampled_from(BASE_DTYPES))
        inputs = draw(st.integers(1, 2))
        none_input = inputs == 2 and draw(st.integers(0, 2)) == 2
        root_param = draw(st.integers(0, 3)) == 3
        nodes = []

        def corners(op):
            dtype = _weighted(draw, DTYPE_ODDS, lambda v: v == "base" or op in DTYPE_OPS[v])
            layouts = [lay for lay, ops in LAYOUT_OPS.items() if op in ops]
            layout = layouts[0] if layouts and draw(st.integers(0, 2)) == 2 else "contiguous"
            gate = _weighted(draw, GATE_ODDS) if gates else None
            depth = _weighted(draw, DEPTH_ODDS)
            own = depth > 0 and draw(st.integers(0, 2)) == 2
            form = _weighted(draw, FORM_ODDS, lambda v: op in FORM_OPS and dtype in ("base", "float64")
                             and layout == "contiguous")
            return {"dtype": dtype, "layout": layout, "gate": gate, "frozen": draw(st.integers(0, 11)) == 11,
                    "depth": depth, "own": own, "form": form}

        def shared(op, nd):  # reuse an earlier module or tie its weight
            mates = [j for j, o in enumerate(nodes) if o["op"] == op and o["reuse"] is None]
            how = draw(st.integers(0, 3))
            if how == 3:  # a tie needs Linear-held weights on both sides
                mates = [j for j in mates if nodes[j]["form"] == "module"] if nd["form"] == "module" else []
            if not mates or how < 2 or (how == 3 and op not in TIE_OPS):
                return nd
            j = draw(st.sampled_from(mates))
            same = {k: nodes[j][k] for k in ("dtype", "layout", "sparse", "frozen", "form")}
            return dict(nd, **same, **({"tie": j} if how == 3 else {"reuse": j}))

        for k in range(inputs):
            op = draw(st.sampled_from(("stem", "conv_stem")))
            nodes.append(shared(op, node(op, [f"x{k}"], **corners(op))))
        for _ in range((0, 0, 1, 1, 2)[draw(st.integers(0, 4))]):  # the indices: embeddings, sparse or dense
            op = draw(st.sampled_from(SPARSE_OPS))
            nd = shared(op, node(op, ["idx"], sparse=draw(st.integers(0, 2)) > 0, **corners(op)))
            nodes.append(dict(nd, gate=None) if nd["sparse"] else nd)  # always used (spec: why)
        for _ in range(draw(st.integers(1, max_hidden))):
            op = draw(st.sampled_from(HIDDEN_OPS))
            n_src = draw(st.integers(1, min(2, len(nodes))))
            src = draw(st.lists(st.integers(0, len(nodes) - 1), min_size=n_src, max_size=n_src, unique=True))
            apply = _weighted(draw, APPLY_ODDS, lambda v: (reentrant or v != "checkpoint_reentrant")
                              and not (v.startswith("checkpoint") and op in BUFFER_OPS))
            nodes.append(shared(op, node(op, sorted(src), merge=draw(st.sampled_from(("mean", "mul"))),
                                         apply=apply, **corners(op))))
        read = {s for nd in nodes for s in nd["src"] if isinstance(s, int)}
        outputs = [i for i in range(len(nodes)) if i not in read or nodes[i]["sparse"]]
        extra = draw(st.integers(0, len(nodes) + 2))
        if extra < len(nodes) and extra not in outputs:
            outputs.append(extra)
        head = _weighted(draw, HEAD_ODDS, lambda v: v != "checkpoint_reentrant" or (
            reentrant and all(needs_grad(nodes, o) for o in outputs)))
        return {"base": base, "inputs": inputs, "nodes": nodes, "outputs": outputs, "root_param": root_param,
                "none_input": none_input, "returns": _weighted(draw, RETURNS_ODDS), "head": head}
    return build()
