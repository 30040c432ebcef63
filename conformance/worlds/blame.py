"""Who to blame for a failed task: a pure function of per-replica evidence.

When a task fails on a world, the World knows per replica how its task ended (``raised``,
``died``, still running at the bound = ``hung``, returned = ``ok``) and where it is: the
collective it is inside, read from the kit's progress board (the collectives the kit
instruments) or found in its Python stack or traceback (:func:`collective_in`: a frame of
torch.distributed or torch_xla, so a DDP that calls them itself is seen too). :func:`blame`
decides from that alone, in this order:

* a replica aborted because the replicas' calls did not match (gloo's "collective mismatch",
  "Received data size doesn't match expected size"): the receiver's death is a symptom, not the
  fault - a replica in a different collective is named; if all sit in the same one (the sizes
  differ), every replica in it is named ``mismatched``: which one deviated cannot be told from
  their stacks (the kit does not see a DDP's own call sequence);
* a replica died: the dead are culprits (on a host of several replica threads, only those
  outside any collective when some of them were inside one); an abort inside a collective also
  names the peers sitting in another one; the rest were cut off (``aborted-by-peer``);
* a replica raised outside a collective: it is the culprit, the others were cut off
  (``aborted-by-peer``). If every exception came out of a collective (a gloo timeout, a closed
  connection), those replicas were *waiting*, and a replica still running outside any
  collective, or one that returned, is the culprit;
* a bound passed: replicas inside a collective are *waiting*; the culprit is a replica elsewhere
  (hung in its own code, stalled), else one that returned (it skipped a collective the others
  entered), else - all waiting - the ones in a different collective from the majority.

No torch import; nothing here reads a process.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, field

# Functions of torch.distributed / torch_xla that block until every replica joins.
COLLECTIVE_FUNCTIONS = frozenset({
    "all_reduce", "all_reduce_coalesced", "broadcast", "broadcast_coalesced", "all_gather",
    "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "reduce", "gather", "scatter", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "batch_isend_irecv",
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
    "send_object_list", "recv_object_list", "wait_tensor", "collective_permute", "rendezvous",
    "psum", "all_reduce_many", "all_reduce_", "broadcast_"})
# Library directories whose frames may be collectives (path fragments, '/'-separated).
_LIBRARIES = ("torch/distributed/", "torch_xla/", "ddp_impl/runtime/collectives.py", "ddp_impl/runtime/xla.py")
# Step syncs and waits that block on collectives issued before (XLA runs its lazy
# collectives in the step sync; torch futures complete when the collective does).
_SYNCS = {"torch_xla/core/xla_model.py": {"mark_step", "wait_device_ops"},
          "torch_xla/torch_xla.py": {"sync"},
          "ddp_impl/runtime/xla.py": {"mark_step"},
          "torch/futures/__init__.py": {"wait", "value"}}
# An innermost frame in the user's own code at `x.wait()`: a C++ wait (dist.Work.wait);
# a Python-level wait (threading.Event, subprocess) would have frames below it.
_C_WAIT = re.compile(r"\.wait\(\s*\)")
_FH_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)', re.M)


@dataclass
class Frame:
    path: str
    line: int
    func: str

    def where(self) -> str:
        """``dir/file.py:12 in func`` (the last two path components)."""
        return f"{'/'.join(self.path.split('/')[-2:])}:{self.line} in {self.func}"


def frames(text: str) -> list[Frame]:
    """The frames of a ``faulthandler`` dump of one thread or of a Python traceback,
    innermost first (a chained traceback: its last exception only)."""
    traceback = "Traceback (most recent call last):" in text
    if traceback:
        text = text.rsplit("Traceback (most recent call last):", 1)[1]
    fs = [Frame(m["path"], int(m["line"]), m["func"]) for m in _FH_FRAME.finditer(text)]
    return fs[::-1] if traceback else fs


def _library(path: str) -> str | None:
    path = path.replace("\\", "/")
    for lib in _LIBRARIES:
        i = path.rfind("/" + lib)
        if i >= 0:
            return path[i + 1:]
    return None


def _name(rel: str, func: str) -> str:
    if rel.startswith("torch/distributed/distributed_c10d.py"):
        return f"torch.distributed.{func}"
    return rel[:-3].replace("/", ".").replace(".__init__", "") + "." + func


def collective_in(text: str, source=linecache.getline) -> str | None:
    """The collective a stack (or traceback) ``text`` is inside, e.g.
    ``torch.distributed.all_reduce at mydp.py:41 in _reduce``, or ``None``.

    Recognised: the blocking functions of torch.distributed and torch_xla
    (:data:`COLLECTIVE_FUNCTIONS`), their step syncs and waits, the kit's own collectives, and an
    innermost user frame at ``x.wait()`` (a C++ ``Work.wait``; ``source(path, line)`` reads that
    line). The caller named is the first frame outside those libraries.
    """
    fs = frames(text or "")
    for i, f in enumerate(fs):
        rel = _library(f.path)
        if rel is None:
            continue
        if f.func in COLLECTIVE_FUNCTIONS or f.func in _SYNCS.get(rel, ()):
            caller = next((g for g in fs[i + 1:] if _library(g.path) is None), None)
            return _name(rel, f.func) + (f" at {caller.where()}" if caller else "")
    if fs and _library(fs[0].path) is None and _C_WAIT.search(source(fs[0].path, fs[0].line) or ""):
        return f"Work.wait at {fs[0].where()}"
    return None


def top_frame(text: str, source=linecache.getline) -> str | None:
    """The innermost frame of a stack ``text`` with its source line, e.g.
    ``mydp.py:12 in _hook: time.sleep(600)``; ``None`` without frames."""
    fs = frames(text or "")
    if not fs:
        return None
    src = re.sub(r"\s{2,}#.*$", "", (source(fs[0].path, fs[0].line) or "").strip())  # a trailing comment
    return fs[0].where() + (f": {src[:120]}" if src else "")


@dataclass
class Blame:
    """The decision of :func:`blame`.

    Attributes:
        culprits: ranks to blame, ascending.
        status: final status per rank: ``raised``, ``hung``, ``died``, ``ok`` (a culprit keeps how
            its task ended), ``waiting`` (inside a collective a culprit never reached, at the
            bound), ``mismatched`` (inside a collective whose calls did not match the peers'),
            ``aborted-by-peer`` (cut off by a culprit that raised or died).
        reason: per culprit, why, in words (``outside any collective``, ...).
    """

    culprits: list[int]
    status: dict[int, str]
    reason: dict[int, str] = field(default_factory=dict)


# The runtime's words for replicas whose calls do not match (gloo aborts the receiver).
MISMATCH = re.compile(r"collective mismatch|doesn't match expected size|mismatch(ed)? (in )?(size|shape|collective)",
                      re.IGNORECASE)


def mismatch_text(d: dict) -> str | None:
    """The line of a replica's log or exception that reports a collective mismatch, if any."""
    for text in (d.get("exception_message"), d.get("log_tail")):
        for line in reversed((text or "").splitlines()):
            if MISMATCH.search(line):
                return line.strip()
    return None


def collective_key(d):
    """Which collective a replica (a diagnosis or a progress slot) waits in: ``(collectives entered, name)``."""
    return d.get("collectives"), (d.get("in_collective") or "").split(" ")[0]


def blame(diagnoses: list[dict]) -> Blame:
    """Decide the culprits of a failed task from per-replica ``diagnoses``.

    Each entry needs ``rank`` and ``status`` (``raised``, ``died``, ``hung``: still in the task,
    ``ok``: returned) and may have ``host``, ``in_collective`` (the collective it is inside, or
    raised from; ``None`` when outside any), ``collectives`` (how many it entered, from the
    board), ``last_collective`` and ``signal``. Pure: reads nothing else, changes nothing.
    """
    ev = _Evidence(diagnoses)
    mismatched = [r for r in ev.of["died"] + ev.of["raised"] if r in ev.inside and mismatch_text(ev.by[r])]
    if mismatched:
        return _blame_mismatch(ev, mismatched)
    if ev.of["died"]:
        return _blame_deaths(ev)
    if ev.of["raised"]:
        return _blame_raises(ev)
    return _blame_bound(ev)


class _Evidence:
    """What :func:`blame` decides from: each replica's diagnosis by rank (``by``), its status so far
    (``status``, changed as blame is decided), the ranks inside a collective (``inside``), the
    ranks of each way a task ended (``of``) and the culprits' reasons."""

    def __init__(self, diagnoses):
        self.by = {d["rank"]: d for d in diagnoses}
        self.status = {r: d["status"] for r, d in self.by.items()}
        self.inside = {r for r, d in self.by.items() if d.get("in_collective")}
        self.of = {s: [r for r in sorted(self.by) if self.status[r] == s] for s in ("died", "raised", "hung", "ok")}
        self.reason = {}

    def decided(self, culprits) -> Blame:
        return Blame(sorted(culprits), self.status, self.reason)


def _blame_mismatch(ev: _Evidence, mismatched) -> Blame:
    """The module docstring's first rule: the runtime reported that the calls did not match."""
    by, status, reason = ev.by, ev.status, ev.reason
    lasts = {by[r].get("last_collective") for r in mismatched}
    elsewhere = [o for o in by if o not in mismatched and by[o].get("last_collective")
                 and by[o].get("last_collective") not in lasts]
    if elsewhere:  # a peer provably in a different collective
        for o in elsewhere:
            reason[o] = f"in a different collective ({by[o].get('last_collective')}) from replica {mismatched[0]}"
        culprits = elsewhere
    else:
        culprits = sorted(r for r in by if r in ev.inside or r in mismatched)
        for r in culprits:
            reason[r] = "collective mismatch: the replicas' calls differ at this point; which one deviated is unknown"
            status[r] = "mismatched"
    for r in by:
        if r not in culprits and status[r] in ("hung", "raised"):
            status[r] = "aborted-by-peer"
    return ev.decided(culprits)


def _blame_deaths(ev: _Evidence) -> Blame:
    """The module docstring's second rule: replicas died."""
    by, status, reason, inside, of = ev.by, ev.status, ev.reason, ev.inside, ev.of
    culprits = set(of["died"])
    for r in of["died"]:
        reason[r] = "died"
    for h in {by[r].get("host") for r in of["died"]}:  # a host of several replica threads
        ds = [r for r in of["died"] if by[r].get("host") == h]
        outside = [r for r in ds if r not in inside]
        if len(ds) > 1 and 0 < len(outside) < len(ds):
            culprits -= set(ds) - set(outside)
            for r in outside:
                reason[r] = "outside any collective while its peers waited in one"
    for r in of["died"]:  # an abort inside a collective whose peers sit in another one
        d = by[r]
        if d.get("signal") == "SIGABRT" and r in inside:
            for o in by:
                last = by[o].get("last_collective")
                if status[o] != "died" and last and last != d.get("last_collective"):
                    culprits.add(o)
                    reason[o] = f"in a different collective ({last}) from replica {r}"
    for r in of["hung"] + [r for r in of["raised"] if r in inside]:
        if r not in culprits:
            status[r] = "aborted-by-peer"
    return ev.decided(culprits)


def _blame_raises(ev: _Evidence) -> Blame:
    """The module docstring's third rule: replicas raised."""
    status, reason, inside, of = ev.status, ev.reason, ev.inside, ev.of
    genuine = [r for r in of["raised"] if r not in inside]
    if genuine:
        for r in genuine:
            reason[r] = "raised"
        for r in of["hung"] + [r for r in of["raised"] if r in inside]:
            status[r] = "aborted-by-peer"
        return Blame(genuine, status, reason)
    # every exception came out of a collective (the runtime's own timeout): who did they wait for?
    elsewhere = [r for r in of["hung"] if r not in inside]
    culprits = elsewhere or of["ok"]
    if not culprits:
        for r in of["raised"]:
            reason[r] = "raised inside a collective"
        for r in of["hung"]:
            status[r] = "aborted-by-peer"
        return Blame(of["raised"], status, reason)
    for r in culprits:
        reason[r] = ("outside any collective while its peers waited in one" if r in elsewhere
                     else "returned from the task while its peers waited in a collective")
    for r in of["raised"] + of["hung"]:
        if r not in culprits:
            status[r] = "waiting"
    return Blame(culprits, status, reason)


def _blame_bound(ev: _Evidence) -> Blame:
    """The module docstring's last rule: a bound passed."""
    by, status, reason, inside, of = ev.by, ev.status, ev.reason, ev.inside, ev.of
    waiters = [r for r in of["hung"] if r in inside]
    culprits = [r for r in of["hung"] if r not in inside]
    for r in culprits:
        reason[r] = ("outside any collective while its peers waited in one" if waiters
                     else "no answer within the bound")
    if not culprits and waiters and of["ok"]:
        culprits = of["ok"]
        for r in culprits:
            reason[r] = "returned from the task while its peers waited in a collective"
    if not culprits and waiters:  # all inside collectives: the odd ones out
        keys = [collective_key(by[r]) for r in waiters]
        modal = [k for k in set(keys) if keys.count(k) > len(keys) / 2]
        culprits = [r for r in waiters if not modal or collective_key(by[r]) != modal[0]] or waiters
        for r in culprits:
            reason[r] = (f"in a different collective ({by[r].get('in_collective')}) from the others"
                         if modal and collective_key(by[r]) != modal[0] else "waits in a collective like the others")
    for r in waiters:
        if r not in culprits:
            status[r] = "waiting"
    return ev.decided(culprits)
