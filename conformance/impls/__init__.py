"""conformance.impls."""
