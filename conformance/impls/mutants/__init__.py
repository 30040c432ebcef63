"""conformance.impls.mutants."""
