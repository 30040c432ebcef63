"""Exceptions shared by every layer of the kit (a leaf module: it imports nothing
of the kit, so faces, tables and runtimes can all use it without import cycles)."""
from __future__ import annotations


class UsageError(Exception):
    """Bad user input (a flag, a file, a spec); ``str(exc)`` is the one line printed
    after ``error:`` (exit code 2)."""


class Unsupported(Exception):
    """The implementation under test cannot serve a case (a keyword it does not
    honour, a method it lacks, a runtime it cannot run on). ``reason`` is one line.

    Raised wherever the fact is discovered (in a replica, in an implementation's
    wrapper, in a case's setup) and caught in one place,
    :func:`conformance.evaluate.evaluate`, which turns it into ``unsupported``
    verdicts carrying the reason.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def split_list(value: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (comma lists of the CLI and pytest options)."""
    return [x.strip() for x in (value or "").split(",") if x.strip()]
