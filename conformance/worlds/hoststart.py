"""How hosts start (``Settings.host_start``): from a ``multiprocessing`` fork server that imported
:mod:`conformance.worlds.preload`, or, with ``spawn``, as fresh interpreters.

Why the server: a host forked from it starts and closes in a small fraction of the time of a
fresh interpreter, which imports torch itself (docs/robustness.md "A lost world is replaced in a
tenth of a second"). The server starts once per kit process (seconds of imports);
:func:`start_server` starts it early, while the kit process still imports and selects its
cases. Imports neither torch nor the kit's runtimes (the CLI calls :func:`start_server` first).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
from multiprocessing import forkserver

PRELOAD = "conformance.worlds.preload"


def host_context(start: str = "forkserver"):
    """The ``multiprocessing`` context a :class:`conformance.worlds.spawned.World` starts its hosts
    from; ``start``: ``Settings.host_start``."""
    if start == "spawn":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    return ctx


def start_server(start: str = "forkserver") -> None:
    """Start the fork server now, without waiting for its imports (a no-op with ``spawn``, or
    when it runs already). Errors are left for the first world to report."""
    if start == "spawn":
        return
    try:
        host_context(start)
        forkserver.ensure_running()
    except Exception:  # reported where a world starts
        pass


def stop_server() -> None:
    """Kill the fork server now, if this process started one: for a command that ends before its
    first world (bad input, Ctrl-C), the server would otherwise finish its imports (seconds) after
    this process exited. Its hosts, if any, die with it (``PR_SET_PDEATHSIG``). Reads the server
    pid, a private attribute of CPython 3.8-3.13's ``multiprocessing.forkserver``: without it the
    server is left to exit by itself."""
    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if not isinstance(pid, int):
        return
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    server._forkserver_pid = None  # a later world starts a new server (ensure_running)
