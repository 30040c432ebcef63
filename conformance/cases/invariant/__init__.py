"""The ``invariant`` kind: rank bindings checked against the launcher, with no implementation under test."""
