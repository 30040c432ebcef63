"""conformance.cases.property."""
