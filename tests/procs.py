"""Process helpers of the meta-tests: is a pid alive, are they all gone."""
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
