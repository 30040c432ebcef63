"""conformance.cases: the case table and its kinds.

``from conformance.cases import CASES, Case, select, all_tags`` is the documented path;
the names are resolved on first use (PEP 562), so importing a sub-module (a kind,
``conformance.cases.shared.loop``, the checks) does not build the whole table.
"""
from __future__ import annotations

import importlib

#: name -> the module that defines it
_EXPORTS = {"CASES": "conformance.cases.table", "select": "conformance.cases.table",
            "all_tags": "conformance.cases.table", "Case": "conformance.cases.row"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
