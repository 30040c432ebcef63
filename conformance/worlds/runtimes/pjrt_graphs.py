"""Graphs a PJRT replica cuts outside the kit's step sync: why an XLA host died, explained.

The kit's step sync (:func:`ddp_impl.runtime.xla.mark_step`) compiles a graph once for all replicas
under a lock, so their collectives meet (docs/runtimes/pjrt.md, cause 1). A DDP that calls
``torch_xla.sync()`` / ``xm.mark_step()`` itself - e.g. inside backward - makes each replica cut
and compile its graph on its own: each gets its own executable, XLA:CPU keys a collective's
rendezvous by the executable's module, and the replicas wait for each other until XLA aborts the
host ("Termination timeout ... only 1 of them arrived"). This module leaves the cause in each
replica's progress slot (shared memory, so it survives the abort): :func:`install` wraps
``torch_xla._XLAC._xla_step_marker`` (the call every torch_xla step sync ends in, torch_xla 2.9)
and, for a call that is not the kit's, notes ``own_graphs``: how many, where the first was called
(the first frame outside torch_xla), the replica's step and phase, and the first collective of
the pending graph (from ``_xla_tensors_report``; a few ms, only on such a call). :func:`describe`
words it for the death's report. Keyed by the device the call names (autograd's threads run
hooks: :mod:`conformance.worlds.runtimes.pjrt_hosts`).
"""
from __future__ import annotations

import os
import re
import sys
import threading

_LOCK = threading.Lock()
_CTX: dict = {}      # device ordinal -> ReplicaContext
_ORIGINAL: dict = {}
_COLLECTIVE = re.compile(r"xla::(?:cross_replica_sum|all_reduce|all_gather|reduce_scatter|all_to_all|"
                         r"collective_permute|send|recv)\w*")


def register(ordinal: int, ctx) -> None:
    """Note own graphs of XLA device ``ordinal`` in ``ctx``'s progress slot."""
    _CTX[ordinal] = ctx


def clear() -> None:
    _CTX.clear()


def _user_frame(frame) -> str:
    """``file:line in fn`` of the first frame outside torch_xla (the DDP's call)."""
    import torch_xla
    root = os.path.dirname(torch_xla.__file__)
    while frame is not None and frame.f_code.co_filename.startswith(root):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _note(device: str, frame) -> None:
    try:
        ordinal = int(str(device).rsplit(":", 1)[-1])
    except ValueError:
        return
    ctx = _CTX.get(ordinal)
    progress = getattr(ctx, "progress", None)
    if progress is None:
        return
    seen = progress.state.get("own_graphs") or {}
    if seen.get("task") == progress.state.get("task"):
        seen["count"] += 1
    else:
        import torch_xla
        report = torch_xla._XLAC._xla_tensors_report(0, str(device))
        m = _COLLECTIVE.search(report)
        st = progress.state
        seen = {"task": st.get("task"), "count": 1, "at": _user_frame(frame), "step": st.get("step"),
                "phase": st.get("phase"), "collective": m.group(0) if m else None}
    progress.update(own_graphs=seen)


def install() -> None:
    """Wrap ``torch_xla._XLAC._xla_step_marker`` (process-wide, idempotent); the kit's own
    step sync passes through unnoted."""
    import torch_xla
    with _LOCK:
        if _ORIGINAL:
            return
        C = torch_xla._XLAC
        original = _ORIGINAL["step_marker"] = C._xla_step_marker
        # the PJRT host imported it before (setup_host); looked up, not imported: it pulls torch
        kit_sync = sys.modules["ddp_impl.runtime.xla"].mark_step.__code__

        def step_marker(device, *args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code is not kit_sync:
                _note(device, caller)
            del caller
            return original(device, *args, **kwargs)
        step_marker.__wrapped__ = original
        C._xla_step_marker = step_marker


def describe(diag: list[dict]) -> str:
    """``replicas compiled different graphs: ...`` from the replicas' ``own_graphs`` notes
    (diagnosis entries of :mod:`conformance.worlds.spawned`), or ``""`` when none cut its own."""
    own = [d for d in diag if d.get("own_graphs")]
    if not own:
        return ""
    bits = []
    for d in own:
        g = d["own_graphs"]
        place = ", ".join(x for x in (f"step {g['step']}" if g.get("step") is not None else "",
                                      f"phase {g['phase']}" if g.get("phase") else "") if x)
        bits.append(f"replica {d['rank']} cut {g['count']} graph(s) itself, the first at {g['at']}"
                    + (f" ({place})" if place else "")
                    + (f", first op that must meet the others: {g['collective']}" if g.get("collective") else ""))
    return ("replicas compiled different graphs: " + "; ".join(bits) + " - a step sync outside the kit's "
            "(torch_xla.sync() / xm.mark_step() in the DDP) makes each replica compile its own executable, "
            "whose collectives never meet the other replicas'")
