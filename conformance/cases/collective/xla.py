"""The ``collective`` family on the PJRT runtime: torch_xla's collectives, op by op, against the
same host oracle and judge as the CPU runtime (:mod:`conformance.cases.collective.run`).

Each row of the family maps to a torch_xla call (:data:`XLA_OPS`: ``xm.all_reduce``, AVG as SUM
with ``scale=1/n``; the list forms into a preallocated ``output=``; the ring ``send_recv`` as
``xm.collective_permute``) or to a reason it has none (:data:`NO_EQUIVALENT`: those rows are
``unsupported`` with the reason, never skipped).

A draw's ``how`` (the CPU runtime's completion mode) is here the layout pinning (``pin_layout=``
of the op, :data:`PINS`). Every replica thread moves its own input to its XLA device as device data (not a Python
scalar: every replica builds the same graph, docs/runtimes/pjrt.md) and reads the result back
after the kit's step sync. A call torch_xla rejects (at the call or when the graph compiles) is
a ``{"raised": ...}`` entry; the judge makes it ``unsupported`` when every rank says the same.
Groups (:func:`groups_of`): the world, and at even W >= 4 the pairs (XLA's replica groups cover
every replica). The plan is small: every distinct (op, dtype, size, reduction, pinning) is one
XLA compilation.
"""
from __future__ import annotations

from functools import partial

from conformance.cases.collective.draws import REPEATS, label, make_input, subgroups
from conformance.cases.collective.ops import OPS, REDUCTIONS
from conformance.cases.collective.run import REFUSALS, every_check, judge, judged_entry, refusal

#: dtypes and per-chunk sizes drawn on PJRT (each distinct shape compiles once per op).
PJRT_DTYPES = ("float32", "bfloat16", "int32")
PJRT_SIZES = (1, 7, 128, 1025)
#: The completion-mode slot of a draw: the layout pinning of the op; the ops drawn otherwise:
#: ``all_gather``'s pinned form pads by the Python ordinal (graphs then differ per replica,
#: ddp_impl.runtime.xla), so it runs unpinned; ``collective_permute`` takes no pinning.
PINS = ("pinned", "unpinned")
OP_PINS = {"all_gather": ("unpinned",), "all_gather_into_tensor": ("unpinned",), "send_recv": ("-",)}

#: torch.distributed ReduceOp name -> torch_xla reduce type (AVG: SUM with scale 1/n).
XLA_REDUCE = {"SUM": "sum", "AVG": "sum", "MAX": "max", "MIN": "min", "PRODUCT": "mul",
              "BAND": "and", "BOR": "or"}

#: Rows of the family with no torch_xla equivalent: the reason their verdicts give.
NO_EQUIVALENT = {
    "reduce": "torch_xla has no rooted reduce (xm.all_reduce gives every replica the result)",
    "gather": "torch_xla has no rooted gather (xm.all_gather gives every replica the result)",
    "scatter": "torch_xla has no scatter from a root",
    "barrier": "torch_xla has no barrier collective (xm.rendezvous is a host-side meeting, not an XLA op)",
    "all_to_all_single": "xm.all_to_all splits into equal chunks only (split_count), no uneven split sizes",
    "batch_isend_irecv": "torch_xla has no batched point-to-point call (the ring runs as "
                         "xm.collective_permute in collective.send_recv)",
}
#: Cases of the family not run on PJRT, with why (their verdicts are ``skip`` with it).
NOT_ON_PJRT = {
    "noncontiguous": "XLA tensors have no strides (the layout is the compiler's), so the layout "
                     "cases do not apply",
    "channels_last_input": "XLA tensors have no memory format, so the layout cases do not apply",
    "aliased_output": "XLA tensors have no storage to alias, so the layout cases do not apply",
    "reused_input": "an XLA collective returns a new value and the input is an immutable graph node: "
                    "there is no storage a backend could cache by address",
    "search": "the Hypothesis search runs on the CPU runtime (every new draw is an XLA "
              "compilation on PJRT)",
}


def groups_of(world_size: int, op: str) -> tuple:
    """Group names drawn on PJRT: the world; the pairs ``[[0, 1], [2, 3], ...]`` at even W >= 4 (not
    for broadcast: ``collective_broadcast`` takes one global ``root_ordinal``, so every other pair
    would have no root)."""
    if world_size >= 4 and world_size % 2 == 0 and op != "broadcast":
        return ("world", "pairs")
    return ("world",)


def plan_pjrt(op: str, world_size: int, profile: str = "dev") -> list[dict]:
    """The draws of ``op`` on PJRT: every (dtype, reduction) of :data:`PJRT_DTYPES` once, the
    pinnings cycled (``thorough``: every pinning of every pair), each size of :data:`PJRT_SIZES`
    at least once, the groups cycled. ``[]`` for an op of :data:`NO_EQUIVALENT`."""
    if op in NO_EQUIVALENT:
        return []
    o = OPS[op]
    pins, groups = OP_PINS.get(op, PINS), groups_of(world_size, op)
    pairs = [(d, r) for d in PJRT_DTYPES for r in (REDUCTIONS[d] if o.reduces else ("-",))]
    if profile == "thorough":  # every pinning of every pair (XLA:CPU refuses some in one form only)
        combos = [(d, r, p) for d, r in pairs for p in pins]
    else:  # the pinnings cycled over the draws: every dtype meets both (few compilations)
        combos = [(d, r, None) for d, r in pairs]
    combos *= -(-len(PJRT_SIZES) // len(combos))
    out = []
    for k in range(len(combos) * REPEATS.get(profile, 1)):
        d, r, p = combos[k % len(combos)]
        p = p or pins[k % len(pins)]
        out.append({"dtype": d, "red": r, "size": PJRT_SIZES[(3 * k + len(op)) % len(PJRT_SIZES)],
                    "how": p, "group": groups[(k // 2) % len(groups)]})
    return out


# --- replica side ---------------------------------------------------------------------

class Refused(Exception):
    """torch_xla offers no call for this draw (e.g. BXOR): the message is the reason."""


def _reduce_args(c):
    red = c["red"]
    if red not in XLA_REDUCE:
        raise Refused(f"torch_xla has no reduce type for {red} (xm.REDUCE_*: sum, mul, and, or, min, max)")
    return XLA_REDUCE[red], (1.0 / c["n"] if red == "AVG" else 1.0)


def _xm():
    import torch_xla.core.xla_model as xm
    return xm


def x_all_reduce(x, c):
    kind, scale = _reduce_args(c)
    return _xm().all_reduce(kind, x, scale=scale, groups=c["groups"], pin_layout=c["pin"])


def x_broadcast(x, c):
    _xm().collective_broadcast([x], root_ordinal=0, groups=c["groups"], pin_layout=c["pin"])
    return x


def x_all_gather(x, c, into_output=True):
    """``xm.all_gather``; the list form (``into_output``) into a preallocated ``output=``."""
    import torch
    out = torch.zeros(x.numel() * c["n"], dtype=x.dtype, device=x.device) if into_output else None
    res = _xm().all_gather(x, dim=0, groups=c["groups"], output=out, pin_layout=c["pin"])
    return out if res is None else res


def x_reduce_scatter(x, c, into_output=True):
    """``xm.reduce_scatter``; the list form (``into_output``) into a preallocated ``output=``."""
    import torch
    kind, scale = _reduce_args(c)
    out = torch.zeros(x.numel() // c["n"], dtype=x.dtype, device=x.device) if into_output else None
    res = _xm().reduce_scatter(kind, x, scale, 0, c["n"], groups=c["groups"], output=out, pin_layout=c["pin"])
    return out if res is None else res


def x_all_to_all(x, c):
    return _xm().all_to_all(x, 0, 0, c["n"], groups=c["groups"], pin_layout=c["pin"])


def x_send_recv(x, c):
    pairs = [[g[i], g[(i + 1) % len(g)]] for g in c["all_groups"] for i in range(len(g))]
    return _xm().collective_permute(x, pairs)


#: op -> its replica call ``fn(x_on_device, ctx) -> result on device``.
XLA_OPS = {"all_reduce": x_all_reduce, "broadcast": x_broadcast, "all_gather": x_all_gather,
           "all_gather_into_tensor": partial(x_all_gather, into_output=False), "reduce_scatter": x_reduce_scatter,
           "reduce_scatter_tensor": partial(x_reduce_scatter, into_output=False), "all_to_all": x_all_to_all,
           "send_recv": x_send_recv}


def _reset_token(device) -> None:
    """After a rejected call: drop the all-reduce token the failed collective left (the next
    collective would chain on it), as the step sync does at its end. Private API, torch_xla 2.9
    (pinned; ddp_impl.runtime.xla.mark_step)."""
    import torch_xla
    torch_xla._XLAC._set_all_reduce_token(str(device), None)


def task_collective_pjrt(ctx, op: str, draws: list) -> list:
    """World task on a PJRT replica thread: :func:`~conformance.cases.collective.run.task_collective`'s
    entries for torch_xla's call of ``op`` (:data:`XLA_OPS`)."""
    fn, o = XLA_OPS[op], OPS[op]
    out = []
    for i, d in enumerate(draws):
        groups = subgroups("pairs", ctx.world_size) if d["group"] == "pairs" else None  # None: every replica
        all_groups = groups or [list(range(ctx.world_size))]
        ranks = next(g for g in all_groups if ctx.rank in g)
        n, me = len(ranks), ranks.index(ctx.rank)
        xs = [make_input(op, i, j, n, d) for j in range(n)]
        ctx.note(phase=label(op, d, ctx.world_size))
        c = {"red": d["red"], "n": n, "grank": me, "groups": groups, "all_groups": all_groups,
             "pin": d["how"] == "pinned"}
        try:
            x = xs[me].to(ctx.device)  # this rank's values as device data: one graph on every replica
            res = fn(x, c)
            ctx.mark_step()
            res = res.cpu().reshape(-1)
        except (Refused, *REFUSALS) as exc:
            _reset_token(ctx.device)
            if isinstance(exc, Refused):  # no torch_xla call at all, in either form
                out.append({"raised": str(exc)})
            else:  # which form XLA refused
                msg = refusal(exc)
                out.append({"raised": f"{d['how']}: {msg}" if d["how"] in PINS else msg})
            continue
        out.append(judged_entry(o, xs, d, me, res))
    return out


def evaluate_pjrt(case, impl, w, session):
    """A ``collective`` row on PJRT (module docstring); an op without a torch_xla equivalent is
    ``unsupported`` with the reason, a layout case or the search ``skip``."""
    op = case.args.get("op")
    what = "search" if case.args.get("search") else case.args.get("layout")
    if what:
        return every_check(case, impl, "pjrt", w, "skip", NOT_ON_PJRT[what])
    if op in NO_EQUIVALENT:
        return every_check(case, impl, "pjrt", w, "unsupported", NO_EQUIVALENT[op])
    key = ("collective", case.name, "pjrt", w, session.settings.profile)

    def verdicts():
        draws = plan_pjrt(op, w, session.settings.profile)
        results = session.run("pjrt", w, task_collective_pjrt, timeout=case.timeout, op=op, draws=draws)
        return None if results is None else judge(case, draws, results, w, "pjrt")
    return session.memo(key, verdicts)
