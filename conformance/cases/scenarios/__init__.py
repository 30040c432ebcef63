"""conformance.cases.scenarios."""
