"""conformance.cli."""
