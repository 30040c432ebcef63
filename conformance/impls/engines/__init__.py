"""The ecosystem's data-parallel engines as implementation rows, one module per engine, each
wired as its public documentation wires it, through the step protocol
(``conformance.cases.shared.step``; docs/engines.md).

Each engine is a pinned extra of the project (``pip install -e '.[engines]'`` or
``[fairscale]``, ``[deepspeed]``, ...): a row whose package is missing, or which cannot run on
this machine (no CUDA), is built with :attr:`~conformance.impls.row.Strategy.unavailable` set,
and its every case is ``skip`` with the reason.
"""
from __future__ import annotations

import importlib.metadata

#: Engines on torch.distributed: the PJRT runtime's replica threads have no process group for them.
NOT_ON_PJRT = {"pjrt": "runs on torch.distributed (gloo); the PJRT runtime's replicas are threads of one "
                       "process with XLA collectives, no process group",
               "xrt": "runs on torch.distributed (gloo) only"}


def missing(distribution: str, pinned: str, extra: str) -> str:
    """The skip reason when ``distribution`` is not installed at version ``pinned`` (``""``: it is)."""
    try:
        have = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return f"{distribution} {pinned} is not installed: pip install -e '.[{extra}]'"
    if have != pinned:
        return (f"{distribution} {have} is installed, the row is pinned to {pinned}: "
                f"pip install -e '.[{extra}]'")
    return ""
