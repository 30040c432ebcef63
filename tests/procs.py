"""Process helpers of the meta-tests: is a pid alive, are they all gone, run the CLI."""
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
