"""What a failed task raises: the :class:`ReplicaError` classes and the builder of their message
from plain data.

:func:`classify` takes the per-replica diagnosis (dicts with the keys of
:data:`conformance.worlds.diagnosis.DIAGNOSIS_KEYS`), what was reported (who raised, which hosts
died, a collective hang) and the bounds, decides who is to blame
(:func:`conformance.worlds.blame.blame`) and returns the summary and the error class;
:func:`replica_error` adds the per-replica details. Neither needs a world:
tests/test_failure_messages.py builds diagnoses by hand.
"""
from __future__ import annotations

import os

from conformance.worlds import blame as blame_mod, diagnosis as dg
from conformance.worlds.runtimes import pjrt_graphs
from conformance.worlds.stacks import replica_stacks, top_frame


class ReplicaError(RuntimeError):
    """A task did not complete on every replica. ``str(exc)`` is :meth:`summary` followed by :meth:`details`.

    Attributes:
        diagnosis: one ``dict`` per replica, by rank, with the keys of
            :data:`conformance.worlds.diagnosis.DIAGNOSIS_KEYS` (``None`` when unknown): ``status``
            (:class:`conformance.worlds.blame.Blame` says each), ``collectives`` (kit-recorded, entered
            in the task), ``in_collective`` (recorded, or found in its stack or traceback), ``stacks``
            (faulthandler with source lines: this replica's thread, then on a one-replica host its
            other threads), ``log_tail`` (its host's last :data:`conformance.worlds.spawned.LOG_TAIL_LINES`
            lines), ``rss_mib`` / ``peak_rss_mib`` (its host process at the report, MiB), plus
            ``culprit`` (bool: named in the summary) and ``culprit_reason``. Empty when the failure
            is not per-replica (e.g. a broken world reused).
    """

    def __init__(self, message: str, diagnosis: list[dict] | None = None):
        self._summary, _, rest = message.partition("\n")
        self._details = rest
        self.diagnosis = diagnosis or []
        text = self._summary + (f"\n{rest}" if rest else "")
        super().__init__(text)

    def summary(self) -> str:
        """One line: the world, the failure kind, the replica(s) to blame and the exception."""
        return self._summary

    def details(self) -> str:
        """Full text: per replica status, place, exception, traceback, stacks, log tail."""
        return self._details


class ReplicaFailed(ReplicaError):
    """A replica raised; the diagnosis holds its exception and traceback."""


def machine_load() -> str:
    """``machine load 7.9 (1 min average) on 2 CPUs``: said where a time bound fires, since a
    bound that assumes a quiet machine can fire on a loaded one (os.getloadavg; 'unknown' where
    the platform has none)."""
    try:
        one = os.getloadavg()[0]
    except (AttributeError, OSError):
        return "machine load unknown"
    return f"machine load {one:.1f} (1 min average) on {os.cpu_count()} CPUs"


class ReplicaTimeout(ReplicaError):
    """A bound passed: the task's timeout, or a replica waited in a collective a
    peer never entered for the runtime's collective bound (or raised the runtime's
    own collective timeout while a peer was elsewhere); stacks of every replica."""


class ReplicaDied(ReplicaError):
    """A host process exited; the diagnosis holds its exit code or signal, stacks, log tail."""


class HostDiedStarting(ReplicaDied):
    """A host process exited before it answered its start-up (before any task of the run).

    Attributes:
        host: the host's index in its world.
        exit_code: its exit code (negative: killed by that signal), as ``Popen.returncode``.
        death: the death in one line, ``host 0 (pid 123) exited with code -11 (SIGSEGV)``.
        where: the Python frame a fatal signal hit, from the host's ``faulthandler`` dump
            (:func:`conformance.worlds.stacks.crash_site`), or ``None``.
    """

    def __init__(self, message: str, host: int, exit_code: int | None, death: str, where: str | None = None):
        super().__init__(message)
        self.host, self.exit_code, self.death, self.where = host, exit_code, death, where

    @property
    def by_signal(self) -> bool:
        """Killed by a signal (a crash such as SIGSEGV or SIGABRT), not an exit of its own."""
        return self.exit_code is not None and self.exit_code < 0


def inside(slot):
    """A board slot with a sampled collective (``seen_collective``) as its ``in_collective``
    when the kit recorded none."""
    if slot.get("in_collective") or not slot.get("seen_collective"):
        return slot
    return dict(slot, in_collective=slot["seen_collective"], since=slot.get("seen_since"))


def all_waiting(board, ranks, task) -> bool:
    """Every replica of ``ranks`` is inside a collective of ``task`` (kit-recorded, or seen in
    its stack), by the progress ``board`` (one slot per rank)."""
    board = [inside(b) for b in board]
    return all(board[r].get("task") == task and board[r].get("in_collective") for r in ranks)


#: What a replica's progress slot says about its advance: a change of any is progress.
PROGRESS_FIELDS = ("task", "step", "phase", "collectives", "last_collective", "in_collective", "seen_collective")


def progress_mark(slot) -> tuple:
    """The part of a progress slot that changes when the replica advances."""
    return tuple(slot.get(k) for k in PROGRESS_FIELDS)


def collective_hang(board, task, now, bound, moved=None):
    """A replica waited in a collective of ``task`` longer than ``bound`` seconds at ``now``
    (``time.monotonic``) while a peer is elsewhere and has not advanced for ``bound`` seconds
    either, or all wait in collectives that differ: ``(board, waiting ranks)``, else ``None``.

    ``moved``: ``{rank: time of the last change of its progress slot}`` (the World's polls;
    :func:`progress_mark`). A peer elsewhere that advanced within the bound is late, not hung
    (docs/robustness.md "A late peer is not a hung one"). Without ``moved`` every peer elsewhere
    counts."""
    board = [inside(b) for b in board]
    current = [b for b in board if b.get("task") == task]
    waiting = [b["rank"] for b in current
               if b.get("in_collective") and b.get("since") and now - b["since"] > bound]
    if not waiting:
        return None
    elsewhere = [r for r in range(len(board))
                 if not board[r].get("in_collective") or board[r].get("task") != task]
    stalled = [r for r in elsewhere if moved is None or board[r].get("state") in ("returned", "raised")
               or now - moved.get(r, float("-inf")) > bound]  # a replica that left the task never comes
    # All inside collectives, but not the same one: they will never meet.
    mismatch = len({blame_mod.collective_key(b) for b in current if b.get("in_collective")}) > 1
    return (board, waiting) if stalled or mismatch else None


def replica_diagnosis(rank, host, pid, task, slot, *, now, rss, dump, host_tids, log_tail,
                      raised, dead, pending) -> dict:
    """One replica's diagnosis (the keys of :data:`conformance.worlds.diagnosis.DIAGNOSIS_KEYS`,
    ``status`` before blame) from plain data: its progress board ``slot``, the time ``now``
    (``time.monotonic``), ``rss`` ``(rss, peak)`` MiB of its host or ``None``, its host's
    faulthandler ``dump`` and replica threads ``host_tids``, its host's ``log_tail``, and what
    the task's wait saw: ``raised`` ``{rank: info}``, ``dead`` ``{host: exit code}``, the
    ``pending`` hosts (still running the task)."""
    b = slot if slot.get("task") == task else {}
    d = dg.blank(rank) | {"host": host, "pid": pid, "task": task, "culprit": False}
    d |= {k: b.get(k) for k in ("step", "phase", "last_collective", "collectives", "in_collective")}
    if b.get("own_graphs"):  # PJRT: a step sync of the DDP's own (runtimes.pjrt_graphs)
        d["own_graphs"] = b["own_graphs"]
    since = b.get("since") if b.get("in_collective") else b.get("seen_since")
    if since:
        d["waited_s"] = round(now - since, 1)
    if rss is not None:
        d["rss_mib"], d["peak_rss_mib"] = rss
    seen_in = None
    if dump:  # one replica per host: its other threads (a DDP's comm thread) count too
        d["stacks"], seen_in = replica_stacks(dump, b.get("tid") or slot.get("tid"), host_tids)
    d["log_tail"] = log_tail
    if rank in raised:
        info = raised[rank]
        d |= {k: info.get(k) for k in ("exception_type", "exception_message", "traceback")}
        d |= {k: info[k] for k in ("step", "phase", "last_collective") if info.get(k) is not None}
        # an exception out of torch.distributed itself (gloo's timeout) was a wait
        d["in_collective"] = info.get("in_collective") or blame_mod.collective_in(d["traceback"] or "")
        d["waited_s"] = None
        d["status"] = "raised"
    elif host in dead:
        d["exit_code"], d["signal"] = dg.exit_description(dead[host])
        d["status"] = "died"
    elif host in pending:  # its host still runs the task: this replica may have returned
        d["status"] = "ok" if b.get("state") == "returned" else "hung"
    else:
        d["status"] = "ok"
    if d["status"] in ("hung", "died") and not d["in_collective"]:
        # a collective the kit did not record: in the stacks now, else the last sample
        d["in_collective"] = seen_in if dump else b.get("seen_collective")
    if not d["in_collective"]:
        d["waited_s"] = None
    return d


def replica_error(diag, head, **facts) -> ReplicaError:
    """The error a failed task raises: :func:`classify`'s class, with its summary followed by
    every replica's details (:func:`conformance.worlds.diagnosis.details`)."""
    summary, cls = classify(diag, head, **facts)
    return cls(f"{summary}\n{dg.details(diag)}", diag)


def classify(diag, head, *, timeout, elapsed, raised, dead, hang, collective_bound, load):
    """Decide the error class and the replicas to blame (:func:`conformance.worlds.blame.blame`);
    set each replica's ``status``, ``culprit`` and ``culprit_reason`` in ``diag``; return
    ``(summary, error class)``.

    Args:
        diag: one diagnosis dict per replica, by rank.
        head: what failed, e.g. ``"cpu world of 2 replica(s): task train"``.
        timeout: the task bound (s); elapsed: the seconds the task ran.
        raised: ``{rank: exception info}`` of the replicas that raised (only its keys are read).
        dead: the hosts that exited (only its truth is read: their exit is in ``diag``).
        hang: ``(board, waiting ranks)`` when a replica waited past the collective bound, else ``None``.
        collective_bound: the runtime's collective bound (s), said when ``hang``.
        load: the machine's load (:func:`machine_load`), said where a bound fired.
    """
    verdict = blame_mod.blame(diag)
    for d in diag:
        d["status"] = verdict.status[d["rank"]]
        d["culprit"] = d["rank"] in verdict.culprits
        d["culprit_reason"] = verdict.reason.get(d["rank"]) if d["culprit"] else None
    culprits = [d for d in diag if d["culprit"]]
    mism = [d for d in diag if d["status"] == "mismatched"]
    if mism:  # the runtime aborted a receiver: the calls did not match (blame.MISMATCH)
        return _mismatch_summary(mism, head), (ReplicaDied if dead else ReplicaFailed)
    if dead:
        return _death_summary(diag, culprits, head), ReplicaDied
    if any(d["status"] == "raised" for d in culprits):
        return _raise_summary(culprits, head), ReplicaFailed
    return _hang_summary(diag, culprits, head, timeout=timeout, elapsed=elapsed, raised=raised, hang=hang,
                         collective_bound=collective_bound, load=load), ReplicaTimeout


def _mismatch_summary(mism, head) -> str:
    """The summary of a collective mismatch between the ``mism`` replicas (none can be blamed)."""
    words = next(filter(None, (blame_mod.mismatch_text(d) for d in mism)), "")
    sides = "; ".join(f"replica {d['rank']}: {dg.where(d) or 'no progress noted'}" for d in mism)
    return (f"{head}: collective mismatch between replicas {', '.join(str(d['rank']) for d in mism)} "
            f"(the runtime says: {words[:300]}): their calls at this point differ in kind or size; "
            f"which replica deviated cannot be told from their stacks [{sides}]")


def _death_summary(diag, culprits, head) -> str:
    """The summary of a task some replicas' hosts died in: how each died, a mismatch or a
    suspect their peers waited for, and what each replica was doing."""
    died = [d for d in diag if d["status"] == "died"]
    parts = []
    for h in sorted({d["host"] for d in died}):
        ds = [d for d in died if d["host"] == h]
        d0 = ds[0]  # the host's death, shared by its replicas
        how = (f"killed by {d0['signal']}" if d0["signal"] else f"exited with code {d0['exit_code']}")
        ranks = ", ".join(str(d["rank"]) for d in ds)
        last = [ln.strip() for ln in (d0.get("log_tail") or "").splitlines() if ln.strip()]
        if d0["signal"] == "SIGABRT" and last:  # the runtime's own words (gloo, XLA)
            how += f" ({last[-1][:300]})"
        parts.append(f"replica {ranks} (host {h}, pid {d0['pid']}) died: {how}")
    # What each replica was doing: who waited in a collective, who was elsewhere.
    doing = [f"replica {d['rank']}: {dg.where(d)}" for d in diag if dg.where(d)]
    # An abort inside a collective whose peers sit in another one (gloo's "Received data size
    # doesn't match"): name both sides of the mismatch.
    other = [d for d in culprits if d["status"] != "died"]
    if other:
        aborted = [d for d in died if d["signal"] == "SIGABRT" and d.get("in_collective")]
        parts.append("collective mismatch: " + " vs ".join(
            f"replica {x['rank']} in {x['last_collective'] or x['in_collective']} (step {x.get('step')})"
            for x in aborted[:1] + other))
    suspects = [d for d in culprits if d["status"] == "died" and d["culprit_reason"] != "died"]
    if suspects:
        parts.append("; ".join(f"replica {d['rank']} is the suspect: outside any collective "
                                f"({dg.where(d) or 'no progress noted'}) while its peers waited in one"
                                for d in suspects))
    graphs = pjrt_graphs.describe(diag)
    if graphs:  # the cause a user must fix, before where they died
        parts.insert(0, graphs)
    # the culprit's words lead: the suspect or the mismatch when named, else the dead
    return (lead(parts[:1] if graphs else parts[-1:] if other or suspects else parts)
            + f"{head}: {len(died)} replica(s) died: " + "; ".join(parts)
            + (f" [{'; '.join(doing)}]" if doing else ""))


def _raise_summary(culprits, head) -> str:
    """The summary of a task the ``culprits`` raised in: each one's exception and place."""
    parts = []
    for d in culprits:
        place = "; ".join(x for x in (f"host {d['host']}, pid {d['pid']}", dg.where(d)) if x)
        parts.append(f"replica {d['rank']} raised {d['exception_type']}: "
                     f"{first_line(d['exception_message'])} [{place}]")
    return lead(parts, culprits) + f"{head}: {len(culprits)} replica(s) raised; " + "; ".join(parts)


def _hang_summary(diag, culprits, head, *, timeout, elapsed, raised, hang, collective_bound, load) -> str:
    """The summary of a hang: the task bound passed, a replica waited past the collective
    bound, or the runtime's own collective timeout fired first (the waiters raised it); the
    culprits (hung or returned) and who waits where. Sets each hung culprit's status."""
    if raised:
        why = (f"replica(s) {sorted(raised)} raised inside a collective (the runtime's own timeout) "
               f"after {elapsed:.1f} s of the task")
    elif hang:
        why = (f"replica(s) {hang[1]} waited in a collective for more than the collective bound "
               f"({collective_bound:.0f} s, below the runtime's own collective timeout) "
               f"after {elapsed:.1f} s of the task")
    else:
        why = f"no answer within {timeout:.0f} s (task bound; {elapsed:.1f} s elapsed)"
    if any((d["culprit_reason"] or "").startswith("in a different collective") for d in culprits):
        why += "; the replicas wait in different collectives (a replica skipped or added one)"
    why += f"; {load}"  # a bound that fired on a busy machine says so
    parts = []
    for d in culprits:
        if d["status"] == "ok":
            after = f" after {d['collectives']} recorded collective(s)" if d.get("collectives") else ""
            parts.append(f"replica {d['rank']} returned from the task{after} while others wait in a "
                         f"collective ({dg.where(d) or 'no progress noted'})")
        else:
            d["status"] = "hung"
            outside = "outside any collective" in (d["culprit_reason"] or "")
            top, rss = top_frame(d.get("stacks") or ""), d.get("rss_mib")
            parts.append(f"replica {d['rank']} hung{' outside any collective' if outside else ''}"
                         f"{f' at {top}' if top else ''} ({dg.where(d) or 'no progress noted'}; "
                         f"rss {'?' if rss is None else f'{rss:.0f} MiB'})")
    waits = [f"replica {d['rank']} in {d['last_collective'] or d['in_collective']}"
             + (f" for {d['waited_s']:.1f} s" if d.get("waited_s") is not None else "")
             + (f" (raised {d['exception_type']})" if d.get("exception_type") else "")
             for d in diag if d["status"] == "waiting"]
    return (lead(parts, culprits) + f"{head}: {why}; " + "; ".join(parts)
            + (f"; waiting: {', '.join(waits)}" if waits else ""))


def lead(parts: list[str], culprits=()) -> str:
    """The first culprit's own words as the summary's first sentence: a report's table prints
    the first sentence, which must say who failed, not which world. With several ``culprits``
    (diagnosis dicts) the sentence names them all first: the first one's words alone would
    read as if it stood out (every replica asleep, all waiting in one step sync)."""
    if not parts:
        return ""
    ranks = [str(d["rank"]) for d in culprits]
    alike = f"no single culprit, replicas {', '.join(ranks)} alike: " if len(ranks) > 1 else ""
    return f"{alike}{parts[0].rstrip('. ')}. "


def first_line(text):
    text = (text or "").strip()
    return text.splitlines()[0][:300] if text else ""
