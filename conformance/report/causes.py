"""Failures that share one cause: a DDP broken everywhere, named once, first.

A DDP that raises in its constructor or at its first step fails every case; each verdict stays
honest (every case is still run and reported), but the summary should say that the failures are
one fault (:func:`shared_cause`, from ``Verdict.replicas``:
:attr:`conformance.worlds.spawned.ReplicaError.diagnosis`). Pure: no torch import.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from conformance.worlds.blame import frames

# A cause is "shared" when it covers at least this fraction of the failing case runs
# (and at least MIN_RUNS of them): "all (or most)" failures.
MOST = 0.5
MIN_RUNS = 2


@dataclass(frozen=True)
class SharedCause:
    """The cause most failing case runs share.

    Attributes:
        cause: ``(kind, message, frame)``: ``kind`` the exception type (``ValueError``)
            or ``died (SIGABRT)`` / ``hung``; ``message`` its first line (``""`` when none);
            ``frame`` the innermost frame (``dir/file.py:12 in forward``) or ``""``.
        runs: failing case runs (case, implementation, runtime, world size) with that cause.
        failing: failing case runs in all.
    """

    cause: tuple[str, str, str]
    runs: int
    failing: int

    def text(self) -> str:
        """One line, e.g. ``all 12 failing case runs share one cause: ValueError: boom at
        mydp.py:30 in forward``."""
        kind, message, frame = self.cause
        share = f"all {self.failing}" if self.runs == self.failing else f"{self.runs} of {self.failing}"
        what = kind + (f": {message}" if message else "") + (f" at {frame}" if frame else "")
        return f"{share} failing case runs share one cause: {what}"


def _first_line(text) -> str:
    text = (text or "").strip()
    return text.splitlines()[0][:300] if text else ""


def _frame(text) -> str:
    fs = frames(text or "")
    return fs[0].where() if fs else ""


def replica_cause(d: dict) -> tuple[str, str, str] | None:
    """The cause of one culprit replica's diagnosis ``d`` (keys of
    :data:`conformance.worlds.diagnosis.DIAGNOSIS_KEYS`; of one that died or hung: its status, exit
    signal or code and innermost stack frame), or ``None`` when nothing is known."""
    if d.get("exception_type"):
        return d["exception_type"], _first_line(d.get("exception_message")), _frame(d.get("traceback"))
    status = d.get("status")
    if status == "died":
        how = d.get("signal") or (f"exit code {d['exit_code']}" if d.get("exit_code") is not None else "")
        return f"died ({how})" if how else "died", "", _frame(d.get("stacks"))
    if status in ("hung", "mismatched"):
        return status, "", _frame(d.get("stacks"))
    return None


def run_cause(replicas: list[dict]) -> tuple[str, str, str] | None:
    """The cause of one failed case run: its first culprit's (lowest rank with a known cause)."""
    for d in sorted(replicas or [], key=lambda d: d.get("rank") or 0):
        if d.get("culprit"):
            c = replica_cause(d)
            if c:
                return c
    return None


def shared_cause(verdicts) -> SharedCause | None:
    """The cause shared by all or most failing case runs of ``verdicts``, else ``None``.

    A case run is one (case, implementation, runtime, world size); its checks share
    one replica failure, so they count once. Runs that failed on a comparison (no
    replica failure) count among the failing runs but have no cause. Returned when
    the most common cause covers at least :data:`MIN_RUNS` runs and more than
    :data:`MOST` of the failing runs (all of them counts too).
    """
    causes: dict[tuple, tuple | None] = {}
    for v in verdicts:
        if v.status != "fail":
            continue
        key = (v.case, v.impl, v.runtime, v.world_size)
        c = run_cause(getattr(v, "replicas", None) or [])
        if causes.get(key) is None:
            causes[key] = c
    known = Counter(c for c in causes.values() if c)
    if not known:
        return None
    cause, n = known.most_common(1)[0]
    if n < MIN_RUNS or not (n == len(causes) or n > MOST * len(causes)):
        return None
    return SharedCause(cause, n, len(causes))
