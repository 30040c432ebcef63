"""Per-replica progress and failure diagnosis for :class:`conformance.worlds.spawned.World`.

A world's host processes write each replica's progress (task, step, phase, last collective)
into a small shared file, one fixed-size slot per replica (:class:`ProgressBoard`, an ``mmap``:
a write costs a few microseconds, and the parent can read the slot after the host hung or died).
When a task fails, the parent joins that with what it knows (exit codes, the replica's
exception, ``faulthandler`` stacks, log tails) into one ``dict`` per replica (the *diagnosis*,
see :data:`DIAGNOSIS_KEYS`) and formats it (:func:`details`).

No torch import here: the parent process stays plain Python.
"""
from __future__ import annotations

import io
import json
import linecache
import mmap
import os
import re
import signal
import threading
import time
import traceback

SLOT_BYTES = 2048
# Keys of one replica's diagnosis (values None when unknown).
DIAGNOSIS_KEYS = ("rank", "host", "pid", "status", "task", "step", "phase", "last_collective",
                  "collectives", "in_collective", "waited_s", "exception_type", "exception_message",
                  "traceback", "stacks", "exit_code", "signal", "log_tail", "rss_mib", "peak_rss_mib",
                  "culprit_reason")
# status values, from most to least to blame (conformance.worlds.blame.Blame says what each means)
REPLICA_STATES = ("raised", "hung", "died", "mismatched", "waiting", "aborted-by-peer", "ok")


# --- the progress board (written by hosts, read by the parent) -------------
def create_board(path: str, world_size: int) -> None:
    """Create the zeroed board file for ``world_size`` replicas (in the parent)."""
    with open(path, "wb") as f:
        f.truncate(SLOT_BYTES * max(1, world_size))


class ProgressBoard:
    """The ``world_size`` progress slots of one world, mapped into this process."""

    def __init__(self, path: str):
        self._f = open(path, "r+b")
        self._mm = mmap.mmap(self._f.fileno(), 0)

    def slot(self, rank: int, **fixed) -> "Progress":
        return Progress(self._mm, rank, fixed)


def read_board(path: str, world_size: int) -> list[dict]:
    """Every replica's last written progress (``{}`` where none or unreadable)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        data = b""
    out = []
    for r in range(world_size):
        raw = data[r * SLOT_BYTES:(r + 1) * SLOT_BYTES].split(b"\0", 1)[0]
        try:
            out.append(json.loads(raw) if raw else {})
        except ValueError:  # torn by a concurrent write: rare, and only a hint
            out.append({})
    return out


class Progress:
    """One replica's slot: what it is doing now. ``ReplicaContext.note`` writes here.

    Fields: ``task`` (number), ``fn`` (task name), ``step``, ``phase``, ``last_collective`` (e.g.
    ``"all_reduce_ #3 float32[10]"``), ``collectives`` (entered in this task), ``in_collective``
    (name while inside one, else None), ``since`` (``time.monotonic()`` when it entered the
    current collective), ``seen_collective`` / ``seen_since`` (a collective the kit did not
    record, found by sampling the stack: :meth:`seen_in`), ``state``
    (``running``/``returned``/``raised``) and the thread ident ``tid`` (to find the replica's
    thread in a stack dump).
    """

    def __init__(self, mm, rank, fixed):
        self._mm, self._off = mm, rank * SLOT_BYTES
        self._lock = threading.Lock()
        self.state = dict(fixed, rank=rank)
        self._flush()

    def _flush(self):
        raw = json.dumps(self.state, default=str).encode()[:SLOT_BYTES - 1]
        self._mm[self._off:self._off + SLOT_BYTES] = raw + b"\0" * (SLOT_BYTES - len(raw))

    def begin(self, task, fn_name: str) -> None:
        with self._lock:
            for k in ("step", "phase", "last_collective", "in_collective", "since", "failed_in",
                      "seen_collective", "seen_since"):
                self.state.pop(k, None)
            self.state.update(task=task, fn=fn_name, collectives=0, state="running",
                              tid=self.state.get("tid") or threading.get_ident())
            self._flush()

    def update(self, **fields) -> None:
        with self._lock:
            self.state.update(fields)
            self._flush()

    def enter(self, name: str) -> None:
        with self._lock:
            self.state["collectives"] = self.state.get("collectives", 0) + 1
            self.state["last_collective"] = f"{name} #{self.state['collectives']}"
            self.state["in_collective"] = name
            self.state["since"] = time.monotonic()
            self._flush()

    def seen_in(self, name: str | None) -> None:
        """Record the collective a sample of this replica's stack shows (``None``: none) as
        ``seen_collective``, with ``seen_since`` (``time.monotonic()`` of the first sample inside
        it). Writes only on a change."""
        with self._lock:
            if self.state.get("seen_collective") == name:
                return
            self.state["seen_collective"] = name
            self.state["seen_since"] = time.monotonic() if name else None
            self._flush()

    def leave(self, failed: bool = False) -> None:
        with self._lock:
            if failed:  # the exception came out of this collective (e.g. a peer vanished)
                self.state["failed_in"] = self.state.get("in_collective")
            self.state["in_collective"] = None
            self.state["since"] = None
            self._flush()


def _shape(t) -> str:
    if isinstance(t, (list, tuple)):
        return f"[{len(t)} tensors]"
    try:
        return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
    except AttributeError:
        return type(t).__name__


class RecordingCollectives:
    """Wraps a :class:`ddp_impl.runtime.collectives.Collectives`; records each call in ``progress``.

    Same methods and attributes as the wrapped object (``sync``, ``all_reduce_many`` and
    ``broadcast_many_`` only when it has them); the record costs one small JSON write per call.
    """

    RECORDED = ("all_reduce_", "broadcast_", "all_gather", "barrier", "sync", "all_reduce_many", "broadcast_many_")

    def __init__(self, inner, progress: Progress):
        self._inner = inner
        for name in self.RECORDED:
            if getattr(inner, name, None) is not None:
                setattr(self, name, recorded(progress, getattr(inner, name),
                                             lambda args, name=name: name + (f" {_shape(args[0])}" if args else "")))

    def __getattr__(self, name):  # rank, world_size, device, ... of the wrapped object
        return getattr(self.__dict__["_inner"], name)


def recorded(progress: Progress, method, label):
    """``method``, each call recorded in ``progress`` as the collective ``label(args)``."""
    def call(*args, **kwargs):
        progress.enter(label(args))
        try:
            value = method(*args, **kwargs)
        except BaseException:
            progress.leave(failed=True)
            raise
        progress.leave()
        return value
    call.__name__ = getattr(method, "__name__", "call")
    return call


def recorded_step_sync(mark_step, progress: Progress):
    """``mark_step`` that records itself as a collective wait (on XLA the lazy
    collectives run, and block, inside the step sync)."""
    def label(_):
        last = progress.state.get("last_collective") or ""
        return "mark_step" + (f" (after {last})" if last and not last.startswith("mark_step") else "")
    return recorded(progress, mark_step, label)


# --- exceptions raised by a replica ---------------------------------------
def failure_info(exc: BaseException, progress: Progress | None = None) -> dict:
    """Picklable description of ``exc`` raised by a task on a replica (call in ``except``)."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    info = {"exception_type": name, "exception_message": str(exc)[:4000],
            "traceback": traceback.format_exc()}
    if progress is not None:
        st = progress.state
        info.update(step=st.get("step"), phase=st.get("phase"), last_collective=st.get("last_collective"),
                    in_collective=st.get("in_collective") or st.get("failed_in"))
    return info


# --- stacks and exit codes -------------------------------------------------
_THREAD_HEAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.M)


def thread_stacks(dump: str) -> dict[int, str]:
    """Split a ``faulthandler`` all-threads dump into ``{thread ident: block}``."""
    heads = list(_THREAD_HEAD.finditer(dump))
    out = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(dump)
        out[int(m.group(2), 16)] = dump[m.start():end].rstrip()
    return out


_FRAME_LINE = re.compile(r'^(\s*)File "([^"]+)", line (\d+)', re.M)


def with_source(block: str) -> str:
    """A ``faulthandler`` stack ``block`` with each frame's source line under it
    (read from the file now; frames whose file is unreadable are left as they are)."""
    out = []
    for line in block.splitlines():
        out.append(line)
        m = _FRAME_LINE.match(line)
        if m:
            src = linecache.getline(m.group(2), int(m.group(3))).strip()
            if src:
                out.append(f"{m.group(1)}    {src}")
    return "\n".join(out)


def exit_description(code) -> tuple[int | None, str | None]:
    """``(exit code, signal name)`` of a ``multiprocessing`` exit code (negative = signal)."""
    if code is None:
        return None, None
    if code < 0:
        try:
            return code, signal.Signals(-code).name
        except ValueError:
            return code, f"signal {-code}"
    return code, None


def tail(path: str, lines: int) -> str:
    """The last ``lines`` lines of ``path`` (``""`` when it cannot be read)."""
    return "".join(io.StringIO(read_text(path)).readlines()[-lines:])


def read_text(path: str) -> str:
    """The text of ``path`` (``""`` when it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# A stack dump (faulthandler, written inside the host's signal handler) is read once its file
# has stopped growing for DUMP_STABLE_S and holds every replica thread, polled every DUMP_POLL_S.
DUMP_POLL_S, DUMP_STABLE_S = 0.02, 0.06


def request_stacks(pids: dict[int, int], paths: dict[int, str], tids=None, bound: float = 3.0) -> None:
    """Ask host processes (``{host: pid}``) for their Python stacks (``faulthandler`` on SIGUSR1,
    written to ``paths[host]``); wait until the dumps stop growing and hold every thread of
    ``tids`` (``{host: [thread ident]}``: a replica's thread may come last), at most ``bound`` s."""
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    last, stable_since = None, None
    end = time.monotonic() + bound
    while time.monotonic() < end:
        time.sleep(DUMP_POLL_S)
        sizes = {i: (os.path.getsize(p) if os.path.exists(p) else 0) for i, p in paths.items()}
        if sizes == last and all(sizes.values()):
            if time.monotonic() - stable_since >= DUMP_STABLE_S and all(
                    set((tids or {}).get(i, ())) <= set(thread_stacks(read_text(p))) for i, p in paths.items()):
                break
        else:
            last, stable_since = sizes, time.monotonic()


# --- formatting -------------------------------------------------------------
def blank(rank: int) -> dict:
    return {k: None for k in DIAGNOSIS_KEYS} | {"rank": rank}


def where(d: dict) -> str:
    """``step 1, phase forward, in all_reduce_ #3`` from a diagnosis entry."""
    bits = []
    if d.get("step") is not None:
        bits.append(f"step {d['step']}")
    if d.get("phase"):
        bits.append(f"phase {d['phase']}")
    if d.get("in_collective"):
        bits.append(f"in {d['last_collective'] or d['in_collective']}"
                    + (f" for {d['waited_s']:.1f} s" if d.get("waited_s") is not None else ""))
    elif d.get("last_collective"):
        bits.append(f"last collective {d['last_collective']}")
    return ", ".join(bits)


def details(diagnosis: list[dict]) -> str:
    """Full text: per replica its status, place, exception, traceback, stacks and log tail."""
    parts, logs_done = [], set()
    for d in diagnosis:
        head = f"=== replica {d['rank']} (host {d.get('host')}, pid {d.get('pid')}): {d.get('status')}"
        place = where(d)
        if d.get("task") is not None:
            place = f"task {d['task']}" + (f", {place}" if place else "")
        parts.append(head + (f" [{place}]" if place else ""))
        if d.get("exception_type"):
            parts.append(f"exception: {d['exception_type']}: {d.get('exception_message')}")
        if d.get("culprit_reason"):
            parts.append(f"blamed: {d['culprit_reason']}")
        if d.get("rss_mib") is not None:
            parts.append(f"resident set {d['rss_mib']:.0f} MiB (peak {d.get('peak_rss_mib') or 0:.0f} MiB) "
                         f"of host {d.get('host')}")
        if d.get("exit_code") is not None:
            parts.append(f"exited with code {d['exit_code']}" + (f" ({d['signal']})" if d.get("signal") else ""))
        if d.get("traceback"):
            parts.append(f"--- replica {d['rank']} traceback:\n{d['traceback'].rstrip()}")
        if d.get("stacks"):
            parts.append(f"--- replica {d['rank']} Python stacks (faulthandler):\n{d['stacks'].rstrip()}")
        if d.get("log_tail") and d.get("host") not in logs_done:
            logs_done.add(d.get("host"))
            n = d["log_tail"].count("\n")
            parts.append(f"--- host {d.get('host')} log tail ({n} lines):\n{d['log_tail'].rstrip()}")
    return "\n".join(parts)


def task_name(fn, payload: dict) -> str:
    """The name a task is reported under (a wrapper such as ``evaluate.guarded``
    names the task it runs in ``payload["task_fn_"]``)."""
    inner = payload.get("task_fn_") if isinstance(payload, dict) else None
    return getattr(inner or fn, "__name__", str(inner or fn))
