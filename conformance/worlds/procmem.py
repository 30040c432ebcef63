"""Memory of local processes, read from ``/proc/<pid>/status`` (Linux), in MiB (the kernel
reports kB = KiB). A reading is ``None`` when it cannot be taken: the process is gone, or this
system has no ``/proc``. It needs no cooperation from the process, so a world's hosts are
measured without running a task on them.
"""
from __future__ import annotations


def status_mib(pid: int, field: str) -> float | None:
    """``field`` (e.g. ``VmRSS``, ``VmHWM``) of process ``pid`` in MiB, or ``None``."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)  # "VmRSS:  123456 kB"
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_mib(pid: int) -> float | None:
    """Resident set size of ``pid`` now (``VmRSS``), MiB."""
    return status_mib(pid, "VmRSS")


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident set size of ``pid`` over its life so far (``VmHWM``), MiB."""
    return status_mib(pid, "VmHWM")


def host_rss(world) -> list[dict]:
    """``[{"host", "pid", "rss_mib"}]``: the resident set (MiB) of each host process of ``world``
    (a :class:`conformance.worlds.spawned.World`)."""
    return [{"host": i, "pid": pid, "rss_mib": rss_mib(pid)} for i, pid in enumerate(world.pids())]
