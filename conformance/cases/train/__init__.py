"""conformance.cases.train."""
