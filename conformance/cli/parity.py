"""Parity cases as a function of seeds and overrides, what ``calibrate`` and ``repeat`` sweep
through :func:`conformance.evaluate.evaluate`. It sits with those faces: it imports the table and
``evaluate``, which no kind may (deferred: the faces parse their options before torch loads)."""
from __future__ import annotations


def parity_mutants() -> list[str]:
    """Mutants some parity case must kill (table order)."""
    from conformance.cases.table import CASES
    out = []
    for c in CASES.values():
        if c.family == "parity":
            out += [m for m in c.must_kill if m not in out]
    return out


class ParityRunner:
    """``verdicts(runtime, w, impl, model, dtype, **overrides) -> {check: Verdict}`` of the
    case ``parity.<model>`` through :func:`conformance.evaluate.evaluate` (replica
    agreement left out: it has no deviation scale)."""

    def __init__(self, session):
        self.session = session

    def verdicts(self, runtime, w, impl, model, dtype="float32", **overrides):
        from conformance.cases.table import CASES
        from conformance.cases.shared.checks import UNBOUNDED
        from conformance.evaluate import evaluate
        vs = evaluate(CASES[f"parity.{model}"], impl, runtime, w, self.session, **overrides)
        return {v.check: v for v in vs if v.check not in UNBOUNDED}

    def forget(self):
        self.session.forget()

    def close(self):
        self.session.close()
