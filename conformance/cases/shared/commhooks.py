"""Registering a comm hook on the DDP under test, shared by every kind that registers one."""
from __future__ import annotations

from conformance.errors import Unsupported


def register_hook(ddp, impl_name: str, hook, state=None) -> None:
    """``ddp.register_comm_hook(state, hook)``; a DDP that raises ``NotImplementedError``
    there (it cannot run a hook in this configuration, e.g. the reference DDP on the XLA
    collectives) is ``unsupported`` with its message.

    Raises:
        Unsupported: the DDP raised ``NotImplementedError``.
    """
    try:
        ddp.register_comm_hook(state, hook)
    except NotImplementedError as exc:
        raise Unsupported(f"{impl_name} cannot register a comm hook here: {exc}") from None
