"""conformance.cases.properties."""
