"""conformance.report."""
