"""``collective.search``: draws of the collective family searched by Hypothesis and shrunk.

The op cases are a deterministic cover (:mod:`~conformance.cases.collective.draws`); a fault
between its points (a backend wrong only above a chunk size, or for one size class) is found by
drawing the draw itself (:func:`draws`). Each example runs one draw on the world, judged by
:func:`~conformance.cases.collective.run.judge`; a failing draw is shrunk (derandomized: the same
command reruns the same examples) and the verdict names it. Not drawn: ``noncontiguous`` inputs
(gloo fails them, finding 13: the layout case reports it) and barrier.
"""
from __future__ import annotations

import json

from conformance.cases.collective.ops import DTYPES, LAYOUT_OPS, OPS, REDUCTIONS, SIZES
from conformance.cases.collective.draws import HOWS, drawn_groups, members
from conformance.cases.collective.run import judge, task_collective
from conformance.cases.shared.search import kit_settings, profile_budget
from conformance.verdict import Verdict

#: Largest per-chunk size drawn (elements): above gloo's 256 KiB chunking for every dtype.
MAX_SIZE = 300_000
#: Examples per world, as a fraction of the profile's property budget (each example is one
#: world task: 10-200 ms).
EXAMPLES_FRACTION = 1.0
#: Layouts drawn, and the ops each applies to (``None``: contiguous, every op).
SEARCH_LAYOUTS = (None, "channels_last_input", "aliased_output", "reused_input")
SEARCH_OPS = tuple(op for op in OPS if op != "barrier")


def draws(world_size: int):
    """The Hypothesis strategy of one draw (a dict as ``plan`` makes, with ``op`` and maybe
    ``layout``)."""
    from hypothesis import strategies as st

    @st.composite
    def one(draw):
        op = draw(st.sampled_from(SEARCH_OPS))
        o = OPS[op]
        layouts = [lay for lay in SEARCH_LAYOUTS if lay is None or op in LAYOUT_OPS[lay]]
        layout = draw(st.sampled_from(layouts))
        dtype = draw(st.sampled_from(DTYPES if layout is None else ("float32", "bfloat16", "int64")))
        red = draw(st.sampled_from(REDUCTIONS[dtype])) if o.reduces else "-"
        if layout == "channels_last_input":
            size = 6 * draw(st.integers(2, MAX_SIZE // 6))
        else:
            size = draw(st.one_of(st.sampled_from(SIZES), st.integers(0, MAX_SIZE),
                                  st.integers(1, 18).map(lambda k: 2 ** k + 1)))
        d = {"op": op, "dtype": dtype, "red": red, "size": size, "how": draw(st.sampled_from(HOWS)),
             "group": draw(st.sampled_from(drawn_groups(world_size, o.p2p)))}
        if o.rooted:
            d["root"] = draw(st.integers(0, len(members(d["group"], world_size)) - 1))
        if layout:
            d["layout"] = layout
        return d
    return one()


class _Found(AssertionError):
    """A failing example: the verdicts of its draw."""

    def __init__(self, verdicts):
        super().__init__("; ".join(v.reason for v in verdicts if v.status == "fail"))
        self.verdicts = verdicts


def evaluate_search(case, impl, runtime, w, session):
    """Verdicts of ``collective.search`` at world size ``w`` (``None`` if the world failed:
    the session reports it)."""
    from hypothesis import given
    budget = max(1, round(profile_budget(session.settings.profile).properties * EXAMPLES_FRACTION))
    state = {"examples": 0, "judged": 0, "lost": False, "last": None}

    @kit_settings(budget)
    @given(d=draws(w))
    def prop(d):
        if state["lost"]:  # a lost world fails every later example at once: no new world per shrink step
            raise _Found([])
        try:
            results = session.run(runtime, w, task_collective, timeout=case.timeout, op=None, draws=[d])
        except Exception as exc:  # the world failed: reported as for any case, after the search stops
            state["lost"] = exc
            raise _Found([]) from None
        if results is None:
            state["lost"] = True
            raise _Found([])
        state["examples"] += 1
        vs = judge(case, [d], results, w)
        state["judged"] += vs[0].status == "pass"  # not a draw the backend refused
        if any(v.status == "fail" for v in vs):
            state["last"] = (d, vs)
            raise _Found(vs)

    try:
        prop()
    except Exception:  # _Found, or Hypothesis' Flaky (a group) when a replay differed
        if isinstance(state["lost"], BaseException):
            raise state["lost"] from None  # the world failed: the session reports it as for any case
        if state["lost"]:
            return None
        if state["last"] is None:
            raise
    if state["last"] is None:
        n, ok = state["examples"], state["judged"]
        refused = f" ({n - ok} refused by the backend)" if n > ok else ""
        return [Verdict(case.name, c, impl, runtime, "-", w, "pass" if ok else "vacuous",
                        reason=(f"{ok} of {n} drawn example(s) equal to the host oracle" if c == "result" else
                                f"every group rank holds the same bits in {ok} drawn example(s)") + refused)
                for c in case.checks]
    d, vs = state["last"]  # the last failing example Hypothesis ran is the shrunk one
    out = []
    for v in vs:
        v.impl = impl
        if v.status == "fail":
            v.reason = f"shrunk counterexample after {state['examples']} example(s): {v.reason}"
            backend = session.settings.backend
            v.diagnosis = (f"draw: {json.dumps(d, sort_keys=True)} (replay: python -m conformance replay "
                           f"SCENARIO.json{f' --backend {backend}' if backend not in (None, 'gloo') else ''})\n{v.diagnosis}").rstrip()
            v.example = {"collective": d, "world_size": w}  # the report writes it as a replayable file
        elif v.status == "pass":
            v.reason = f"{state['examples']} drawn example(s); the failure is another check's"
        out.append(v)
    return out


def load_draw(doc: dict) -> tuple[dict, int] | None:
    """``(draw, world size)`` of a replay file a failing ``collective.search`` verdict wrote
    (``{"scenario": {"collective": draw, "world_size": W}, ...}``, or the inner dict alone);
    ``None`` when ``doc`` holds no collective draw.

    Raises:
        ValueError: the draw names an unknown op, dtype or reduction, or a world size < 2.
    """
    inner = doc.get("scenario", doc) if isinstance(doc, dict) else None
    if not isinstance(inner, dict) or not isinstance(inner.get("collective"), dict):
        return None
    d, w = dict(inner["collective"]), inner.get("world_size")
    if not isinstance(w, int) or w < 2:
        raise ValueError(f"world_size {w!r}: need an integer >= 2")
    if d.get("op") not in OPS or d.get("dtype") not in DTYPES:
        raise ValueError(f"unknown op or dtype in draw {d}")
    if OPS[d["op"]].reduces and d.get("red") not in REDUCTIONS[d["dtype"]]:
        raise ValueError(f"reduction {d.get('red')!r} is not drawn for {d['dtype']}")
    return d, w


def evaluate_draw(case, impl, runtime, w, session, draw: dict):
    """The verdicts of one collective draw (a replay): judged as the search judges an example."""
    results = session.run(runtime, w, task_collective, timeout=case.timeout, op=None, draws=[draw])
    if results is None:
        return None
    vs = judge(case, [draw], results, w)
    for v in vs:
        v.impl = impl
    return vs
