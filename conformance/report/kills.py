"""The kill matrix's data: one cell (:class:`KillRow`: a mutant through one case that must kill
it, on one runtime and world size), the one spelling of its results and the summary per mutant
(:func:`kill_summary`). Every writer (text, JSON, JUnit, HTML) and face reads them from here;
:func:`conformance.evaluate.kill_rows` makes the rows."""
from __future__ import annotations

from dataclasses import dataclass, field

from conformance.report.causes import run_cause
from conformance.verdict import Verdict

#: The one spelling of a kill result, for a cell (:attr:`KillRow.result`) and for a mutant
#: (:func:`kill_summary`) alike; every writer (text, JSON, JUnit, HTML) and face uses these.
KILLED, SURVIVED, UNSUPPORTED, SKIP = "killed", "survived", "unsupported", "skip"
KILL_RESULTS = (KILLED, SURVIVED, UNSUPPORTED, SKIP)
#: A mutant whose own code raises one of these is broken, not killed: the failure says nothing of
#: the case's power (a mutant that cannot be built fails every case).
BROKEN_ERRORS = ("AttributeError", "NameError", "ImportError", "ModuleNotFoundError", "TypeError",
                 "UnboundLocalError", "KeyError", "IndexError")

@dataclass
class KillRow:
    """One (mutant, case that must kill it) cell on one runtime and world size."""

    runtime: str
    world_size: int
    mutant: str
    case: str
    verdicts: list = field(default_factory=list)

    @property
    def result(self) -> str:
        """:data:`KILLED` (a verdict failed), :data:`SURVIVED` (it ran and nothing failed, or
        every failure was the mutant's own code raising a programming error: :meth:`broken`) or
        :data:`UNSUPPORTED`/:data:`SKIP` (it could not run: the reason is in the verdicts)."""
        st = {v.status for v in self.verdicts}
        if "fail" in st or "xfail" in st:
            return SURVIVED if self.broken() else KILLED
        if st - {"unsupported", "skip"}:  # it ran
            return SURVIVED
        return UNSUPPORTED if "unsupported" in st else SKIP

    def broken(self) -> str | None:
        """Why no failure here is a kill: every failing verdict failed because the mutant's own
        code (``conformance/impls/mutants/``) raised a programming error (:data:`BROKEN_ERRORS`),
        so the case never judged the fault; ``None`` otherwise."""
        failing = [v for v in self.verdicts if v.status in ("fail", "xfail")]
        causes = [run_cause(v.replicas or []) for v in failing]
        if not failing or not all(c and c[0] in BROKEN_ERRORS and "mutants/" in c[2] for c in causes):
            return None
        kind, message, frame = causes[0]
        return f"not a kill: the mutant's own code raised {kind}: {message} at {frame}"

    def reason(self) -> str:
        if self.result in (UNSUPPORTED, SKIP):
            return next((v.reason for v in self.verdicts if v.reason), "")
        why = self.broken()
        if why:
            return why
        killers = [v.check for v in self.verdicts if v.status == "fail"]
        return ("killed by " + ", ".join(killers)) if killers else \
            "; ".join(f"{v.check} {v.status}" for v in self.verdicts)

    def to_json(self) -> dict:
        return {"runtime": self.runtime, "world_size": self.world_size, "mutant": self.mutant,
                "case": self.case, "result": self.result, "verdicts": [v.to_json() for v in self.verdicts]}

    @classmethod
    def from_json(cls, d: dict) -> "KillRow":
        return cls(d["runtime"], d["world_size"], d["mutant"], d["case"],
                   [Verdict.from_json(v) for v in d["verdicts"]])


def kill_summary(rows: list[KillRow]) -> dict:
    """Per (mutant, runtime, W): :data:`KILLED` (every case that must kill it did),
    :data:`SURVIVED` (some case that ran did not), :data:`UNSUPPORTED` (nothing could run)."""
    results: dict = {}
    for r in rows:
        results.setdefault((r.mutant, r.runtime, r.world_size), set()).add(r.result)
    return {key: SURVIVED if SURVIVED in rs else KILLED if KILLED in rs else UNSUPPORTED
            for key, rs in results.items()}
