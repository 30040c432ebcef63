"""Process helpers of the meta-tests: is a pid alive, are they all gone, how loaded is the
machine, run the CLI."""
import os
import subprocess
import sys
import time


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _children_by_parent() -> dict[int, list[int]]:
    """``{parent pid: [child pids]}`` of every process now (one pass over /proc)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[-1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (a world's host processes, a CLI's workers)."""
    return _children_by_parent().get(pid, [])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    kids, out, todo = _children_by_parent(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    """``pid``'s command line, arguments separated by spaces (``""`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def world_hosts(pid: int) -> list[int]:
    """The world host processes of the kit process ``pid``: the children of its fork server
    (conformance.worlds.hoststart), or its own spawned children; not the server itself nor
    multiprocessing's resource tracker."""
    out = []
    for child in children(pid):
        cmd = cmdline(child)
        if "multiprocessing.forkserver" in cmd:
            out += children(child)
        elif "multiprocessing.resource_tracker" not in cmd:
            out.append(child)
    return out


def gone(pids, within: float = 10.0) -> bool:
    """Wait up to ``within`` seconds for every pid to end; True if they all did."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, cwd=None, timeout=300, extra_path=None):
    """``python -m conformance *args`` in a subprocess; ``extra_path`` goes first on PYTHONPATH
    (a user's package in a folder)."""
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, REPO, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


#: Start-up of a 2-replica CPU world (``World("cpu", 2)``: spawn, import torch, gloo
#: rendezvous) on the quiet 2-core development machine: 1.2-1.6 s (2.4-2.6 s beside two
#: busy loops). Time bounds written for a quiet machine are scaled by how much slower a
#: start-up measured in the same test was (:func:`load_scale`).
QUIET_START_S = 1.5


def load_scale(startup_s: float) -> float:
    """How many times slower than quiet this machine is now (at least 1), judged by a
    start-up measured in this run (a world's or a child interpreter's that starts one)."""
    return max(1.0, startup_s / QUIET_START_S)


def start_world(runtime: str, world_size: int, **kw):
    """``(World(runtime, world_size, **kw), load scale)``: the world, and :func:`load_scale`
    of its start-up (the time until every replica was ready) for a CPU world of 2; for
    any other world (its quiet start-up is not :data:`QUIET_START_S`), of a CPU world of 2
    started and closed just before."""
    from conformance.worlds.spawned import World
    scale = None if (runtime, world_size) == ("cpu", 2) else measured_scale()
    t0 = time.monotonic()
    world = World(runtime, world_size, **kw)
    return world, scale or load_scale(time.monotonic() - t0)


def measured_scale() -> float:
    """:func:`load_scale` of a CPU world of 2 started (and closed) now."""
    world, scale = start_world("cpu", 2)
    world.close()
    return scale


def default_signals():
    """``preexec_fn`` of a child a test stops with SIGINT / SIGTERM: the child starts with both
    at their defaults. A child inherits an ignored signal, and Python keeps SIGINT ignored when
    it starts ignored, so a test process left ignoring it would make the child deaf to Ctrl-C."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def script_beside_python(name: str) -> str:
    """The console script ``name`` installed beside this interpreter; the test skips without it."""
    import pytest
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        pytest.skip(f"no {name} script beside {sys.executable}")
    return path


def write_user_package(folder, module_text: str = "") -> None:
    """A user's package ``mypkg`` with module ``mypkg.ddp`` holding ``module_text``, in ``folder``."""
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "ddp.py").write_text(module_text)
