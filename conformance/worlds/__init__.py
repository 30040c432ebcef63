"""conformance.worlds."""
