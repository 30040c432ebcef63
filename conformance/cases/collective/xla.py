"""The ``collective`` family on the PJRT runtime: torch_xla's collectives, op by op, against the
same host oracle and judge as the CPU runtime (:mod:`conformance.cases.collective.run`).

Each row of the family maps to a torch_xla call (:data:`XLA_OPS`) or to a reason it has none
(:data:`NO_EQUIVALENT`: those rows are ``unsupported`` with the reason, never skipped).

* ``all_reduce``: ``xm.all_reduce(type, x, scale=, groups=, pin_layout=)`` (functional). AVG is
  SUM with ``scale=1/n``; BXOR has no ``xm.REDUCE_*`` type.
* ``broadcast``: ``xm.collective_broadcast([x], root_ordinal=0, groups=)`` (in place).
* ``all_gather_into_tensor``: ``xm.all_gather(x, dim=0, groups=)``; ``all_gather`` (list): the
  same into a preallocated ``output=`` buffer.
* ``reduce_scatter_tensor``: ``xm.reduce_scatter(type, x, scale, 0, n, groups=)``;
  ``reduce_scatter`` (list): the same into ``output=``.
* ``all_to_all`` (equal chunks): ``xm.all_to_all(x, 0, 0, n, groups=)``.
* ``send_recv`` (the ring): ``xm.collective_permute(x, pairs)``, each group rank sending to the
  next.

The completion modes of the CPU runtime are torch.distributed's; here a draw's ``how`` is the
layout pinning (``pinned`` / ``unpinned``, ``pin_layout=`` of the op) where the op takes it.

Every replica thread rebuilds every group rank's input from the draw's seed on the host and
moves its own to its XLA device (a device tensor, not a Python scalar: every replica builds the
same graph, docs/runtimes/pjrt.md), runs the op, runs the kit's step sync (``ctx.mark_step``,
:func:`ddp_impl.runtime.xla.mark_step`) and reads the result back. A call torch_xla rejects
(at the call or when the graph compiles) is a ``{"raised": ...}`` entry with its message; the
judge makes it ``unsupported`` when every rank says the same.

Groups: the world, and at even W >= 4 the pairs ``[[0, 1], [2, 3], ...]`` (XLA's replica groups
cover every replica; each replica runs the op within its pair). Not for ``broadcast``:
``collective_broadcast`` takes one global ``root_ordinal``, so every other pair has no root.

The plan is small (:data:`PJRT_DTYPES`, :data:`PJRT_SIZES`): every distinct (op, dtype, size,
reduction, pinning) is one XLA compilation.
"""
from __future__ import annotations

from conformance.cases.collective.draws import REPEATS, label, make_input
from conformance.cases.collective.ops import OPS, REDUCTIONS
from conformance.cases.collective.run import (REFUSALS, compare, digest, judge, refusal, result_bound, to_host,
                                              worst_ratio)
from conformance.verdict import Verdict

#: dtypes and per-chunk sizes drawn on PJRT (each distinct shape compiles once per op).
PJRT_DTYPES = ("float32", "bfloat16", "int32")
PJRT_SIZES = (1, 7, 128, 1025)
#: The completion-mode slot of a draw: the layout pinning of the op.
PINS = ("pinned", "unpinned")

#: torch.distributed ReduceOp name -> torch_xla reduce type (AVG: SUM with scale 1/n).
XLA_REDUCE = {"SUM": "sum", "AVG": "sum", "MAX": "max", "MIN": "min", "PRODUCT": "mul",
              "BAND": "and", "BOR": "or"}

#: Rows of the family with no torch_xla equivalent: the reason their verdicts give.
NO_EQUIVALENT = {
    "reduce": "torch_xla has no rooted reduce (xm.all_reduce gives every replica the result)",
    "gather": "torch_xla has no rooted gather (xm.all_gather gives every replica the result)",
    "scatter": "torch_xla has no scatter from a root",
    "barrier": "torch_xla has no barrier collective (xm.rendezvous is a host-side meeting, not "
               "an XLA op)",
    "all_to_all_single": "xm.all_to_all splits into equal chunks only (split_count), no uneven "
                         "split sizes",
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


def _pins(op: str) -> tuple:
    """Pinnings drawn for ``op``: ``all_gather``'s pinned form pads by the Python ordinal
    (graphs then differ per replica, ddp_impl.runtime.xla), so it runs unpinned;
    ``collective_permute`` takes no pinning."""
    if op in ("all_gather", "all_gather_into_tensor"):
        return ("unpinned",)
    if op == "send_recv":
        return ("-",)
    return PINS


def groups_of(world_size: int, op: str) -> tuple:
    """Group names drawn on PJRT: the world; the pairs at even W >= 4 (not for broadcast)."""
    if world_size >= 4 and world_size % 2 == 0 and op != "broadcast":
        return ("world", "pairs")
    return ("world",)


def plan_pjrt(op: str, world_size: int, profile: str = "dev") -> list[dict]:
    """The draws of ``op`` on PJRT: every (dtype, reduction) of :data:`PJRT_DTYPES` once, the
    pinnings cycled (``thorough``: every pinning of every pair), each size of :data:`PJRT_SIZES`
    at least once, the groups cycled. ``[]`` for an
    op of :data:`NO_EQUIVALENT`."""
    if op in NO_EQUIVALENT:
        return []
    o = OPS[op]
    pins, groups = _pins(op), groups_of(world_size, op)
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


def xla_groups(group: str, world_size: int):
    """``groups=`` of a torch_xla call (None: every replica)."""
    if group == "pairs":
        return [[r, r + 1] for r in range(0, world_size, 2)]
    return None


# --- replica side ---------------------------------------------------------------------

class Refused(Exception):
    """torch_xla offers no call for this draw (e.g. BXOR): the message is the reason."""


def _reduce_args(c):
    import torch_xla.core.xla_model as xm  # noqa: F401  (the reduce type strings are its constants)
    red = c["red"]
    if red not in XLA_REDUCE:
        raise Refused(f"torch_xla has no reduce type for {red} (xm.REDUCE_*: sum, mul, and, or, min, max)")
    return XLA_REDUCE[red], (1.0 / c["n"] if red == "AVG" else 1.0)


def x_all_reduce(x, c):
    import torch_xla.core.xla_model as xm
    kind, scale = _reduce_args(c)
    return xm.all_reduce(kind, x, scale=scale, groups=c["groups"], pin_layout=c["pin"])


def x_broadcast(x, c):
    import torch_xla.core.xla_model as xm
    xm.collective_broadcast([x], root_ordinal=0, groups=c["groups"], pin_layout=c["pin"])
    return x


def x_all_gather_into_tensor(x, c):
    import torch_xla.core.xla_model as xm
    return xm.all_gather(x, dim=0, groups=c["groups"], pin_layout=c["pin"])


def x_all_gather(x, c):
    import torch
    import torch_xla.core.xla_model as xm
    out = torch.zeros(x.numel() * c["n"], dtype=x.dtype, device=x.device)
    res = xm.all_gather(x, dim=0, groups=c["groups"], output=out, pin_layout=c["pin"])
    return out if res is None else res


def x_reduce_scatter_tensor(x, c):
    import torch_xla.core.xla_model as xm
    kind, scale = _reduce_args(c)
    return xm.reduce_scatter(kind, x, scale, 0, c["n"], groups=c["groups"], pin_layout=c["pin"])


def x_reduce_scatter(x, c):
    import torch
    import torch_xla.core.xla_model as xm
    kind, scale = _reduce_args(c)
    out = torch.zeros(x.numel() // c["n"], dtype=x.dtype, device=x.device)
    res = xm.reduce_scatter(kind, x, scale, 0, c["n"], groups=c["groups"], output=out, pin_layout=c["pin"])
    return out if res is None else res


def x_all_to_all(x, c):
    import torch_xla.core.xla_model as xm
    return xm.all_to_all(x, 0, 0, c["n"], groups=c["groups"], pin_layout=c["pin"])


def x_send_recv(x, c):
    import torch_xla.core.xla_model as xm
    pairs = [[g[i], g[(i + 1) % len(g)]] for g in c["all_groups"] for i in range(len(g))]
    return xm.collective_permute(x, pairs)


#: op -> its replica call ``fn(x_on_device, ctx) -> result on device``.
XLA_OPS = {"all_reduce": x_all_reduce, "broadcast": x_broadcast, "all_gather": x_all_gather,
           "all_gather_into_tensor": x_all_gather_into_tensor, "reduce_scatter": x_reduce_scatter,
           "reduce_scatter_tensor": x_reduce_scatter_tensor, "all_to_all": x_all_to_all,
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
    fn = XLA_OPS[op]
    out = []
    for i, d in enumerate(draws):
        o = OPS[op]
        groups = xla_groups(d["group"], ctx.world_size)
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
        host = [to_host(x) for x in xs]
        want = o.oracle(host, me, d["red"], d["size"])
        bound = result_bound(o, host, d, want, me)
        got = to_host(res)
        entry = {"digest": digest(res), "findings": compare(got, want, bound, d["dtype"]),
                 "dev": None, "bound": None, "ratio": None}
        if bound is not None and got.shape == want.shape:
            entry["dev"], entry["bound"], entry["ratio"] = worst_ratio(got, want, bound)
        out.append(entry)
    return out


def evaluate_pjrt(case, impl, w, session):
    """A ``collective`` row on PJRT: torch_xla's call of the op
    (:mod:`conformance.cases.collective.xla`), judged as on the CPU runtime; an op without a
    torch_xla equivalent is ``unsupported`` with the reason, a layout case or the search ``skip``."""
    op = case.args.get("op")
    what = "search" if case.args.get("search") else case.args.get("layout")
    if what:
        return [Verdict(case.name, c, impl, "pjrt", "-", w, "skip", reason=NOT_ON_PJRT[what])
                for c in case.checks]
    if op in NO_EQUIVALENT:
        return [Verdict(case.name, c, impl, "pjrt", "-", w, "unsupported", reason=NO_EQUIVALENT[op])
                for c in case.checks]
    key = ("collective", case.name, "pjrt", w, session.settings.profile)

    def verdicts():
        draws = plan_pjrt(op, w, session.settings.profile)
        results = session.run("pjrt", w, task_collective_pjrt, timeout=case.timeout, op=op, draws=draws)
        return None if results is None else judge(case, draws, results, w, "pjrt")
    return session.memo(key, verdicts)
