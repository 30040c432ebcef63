"""conformance.cases.scenario."""
