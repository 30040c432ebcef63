"""Pure helpers on a host's stack dumps (``faulthandler``'s text, see
:func:`conformance.worlds.diagnosis.thread_stacks`): which threads are a replica's, which
collective they are inside, and where a replica is in one line. They read text only (tested
from hand-made dumps: tests/test_failure_messages.py).
"""
from __future__ import annotations

import os

from conformance.worlds import blame as blame_mod, diagnosis as dg

#: The threads the kit itself starts in every host process, as ``(function, file name)``: the
#: parent watchdog and the collective watch of :mod:`conformance.worlds.host`. They are never
#: a replica's (tests/test_failure_messages.py checks the names against that module).
KIT_THREADS = (("watch", "host.py"), ("watch_collectives", "host.py"))


def kit_thread(block):
    """True for a stack of the kit's own host threads (:data:`KIT_THREADS`)."""
    return any((f.func, os.path.basename(f.path)) in KIT_THREADS for f in blame_mod.frames(block))


def replica_stacks(dump, tid, host_tids):
    """``(stacks, collective)`` of the replica on thread ``tid`` from its host's faulthandler
    ``dump`` (with source lines), and the collective (:func:`conformance.worlds.blame.collective_in`)
    the first of those threads is inside. Its threads: on a host of one replica (``host_tids``: the
    replica threads of the host), every thread; on a host of several, its own, plus the threads
    no replica owns when it alone waits in backward (autograd runs an XLA device's backward, and
    its hooks, on a worker thread of its own)."""
    blocks = {t: b for t, b in dg.thread_stacks(dump).items() if not kit_thread(b)}
    mine = blocks.get(tid) if tid else None
    if len(host_tids) <= 1:
        ordered = ([mine] if mine else []) + [b for t, b in blocks.items() if t != tid]
    elif mine is None:
        return dump, None
    else:
        ordered = [mine]
        in_backward = [t for t in host_tids if innermost(blocks.get(t)) == "_engine_run_backward"]
        if in_backward == [tid]:
            ordered += [b for t, b in blocks.items() if t not in host_tids and worker(b)]
    seen = next((c for c in map(blame_mod.collective_in, ordered) if c), None)
    text = "\n\n".join(dg.with_source(b) for b in ordered) if ordered else dump
    return text, seen


def top_frame(stacks):
    """Where a replica is, in one line: the innermost frame of its first thread that is neither
    just waiting for autograd (whose worker thread runs the backward) nor blocked on a
    ``threading`` primitive (it waits for another thread of its own, e.g. a DDP's communication
    thread, which is where the replica is)."""
    blocks = list(dg.thread_stacks(stacks).values()) or [stacks]
    busy = [b for b in blocks if innermost(b) != "_engine_run_backward" and not waits_for_a_thread(b)]
    if not busy:
        busy = [b for b in blocks if innermost(b) != "_engine_run_backward"]
    return blame_mod.top_frame((busy or blocks)[0])


def crash_site(dump):
    """Where a fatal signal hit, in one line (:func:`conformance.worlds.blame.top_frame` of the
    thread ``faulthandler`` marks ``Current thread`` in its fatal dump); ``None`` when the
    dump has no such thread, or it ran no Python."""
    block = next((b for b in dg.thread_stacks(dump or "").values() if b.startswith("Current thread")), None)
    return blame_mod.top_frame(block) if block else None


def innermost(block):
    fs = blame_mod.frames(block or "")
    return fs[0].func if fs else None


def waits_for_a_thread(block):
    """True when the innermost frame of a stack is in the standard library's ``threading``
    module (``Event.wait``, ``Condition.wait``, ``Thread.join``, and ``queue.Queue.get`` and
    ``Future.result``, which wait through it)."""
    fs = blame_mod.frames(block or "")
    return bool(fs) and fs[0].path.replace("\\", "/").endswith("/threading.py")


def worker(block):
    """A thread started outside Python (no ``threading`` bootstrap, not the main thread)."""
    fs = blame_mod.frames(block)
    return bool(fs) and fs[-1].func not in ("_bootstrap", "<module>")
