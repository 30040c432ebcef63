"""conformance.cases."""
