"""Kept only for ``conformance/cli/main.py``, which imports ``kill_rows`` from here: the kill
matrix lives in :mod:`conformance.evaluate` (remove this module once that import moves)."""
from conformance.evaluate import kill_rows  # noqa: F401
