"""What share of the selected table an implementation was tested on, and what the rest cost.

A verdict is *tested* when its check ran (``pass``, ``fail``, ``vacuous``, ``xfail``); an
``unsupported`` verdict (the DDP lacks what the case needs) or a ``skip`` (the case cannot run
here) was not. The untested verdicts are grouped by cause, largest first, so a user sees which
one missing feature cost the most (``refuses keyword find_unused_parameters: 62 verdicts in 3
families``). Pure functions over verdicts: the summary line, the JSON report's ``coverage``
key and the HTML report take their figures from :func:`coverage`.

A generated-scenario case judges the scenarios its DDP ran: those it refused (a corner, a keyword)
or crashed on (the statement excluded) are counted apart (``Verdict.programs``), and its verdicts
count as tested in the share of scenarios run - a case that ran 2 of 14 scenarios is not 100 %.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from conformance.verdict import Verdict

TESTED = ("pass", "fail", "vacuous", "xfail")
UNTESTED = ("unsupported", "skip")
#: Reason shapes of an unsupported verdict whose leading words name the whole cause (the
#: rest is the exception text, which may name a case-specific detail).
_CAUSE_HEADS = (r"refuses keyword \w+", r"has no [\w.]+\(\)", r"ignores constructor argument \w+")
#: Longest cause kept from a free-form reason (its first line).
CAUSE_CHARS = 100


def cause_of(v: Verdict) -> str:
    """The cause an untested verdict is grouped by: its reason without the implementation's
    name, cut to the leading words of a known reason shape, else to the first line (at most
    :data:`CAUSE_CHARS` characters)."""
    text = (v.reason or "no reason given").strip().splitlines()[0]
    for head in _CAUSE_HEADS:  # also behind a label ("every scenario: <impl> refuses keyword k")
        m = re.search(head, text)
        if m:
            return m.group(0)
    for prefix in (f"{v.impl}: ", f"{v.impl} "):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS - 3] + "..."


@dataclass
class Cause:
    """``verdicts`` untested verdicts of one ``status`` share ``cause``, over ``cases`` and
    ``families`` (sorted names)."""

    status: str
    cause: str
    verdicts: int
    cases: list = field(default_factory=list)
    families: list = field(default_factory=list)

    def text(self) -> str:
        fam = len(self.families)
        return (f"{self.status} - {self.cause}: {self.verdicts} verdict{'s' * (self.verdicts != 1)} "
                f"in {len(self.cases)} case{'s' * (len(self.cases) != 1)}, {fam} "
                f"famil{'ies' if fam != 1 else 'y'}")


@dataclass
class Coverage:
    """One implementation's coverage: ``tested`` of ``verdicts`` verdicts ran their check;
    ``causes`` groups the rest, largest first."""

    impl: str
    verdicts: int
    tested: int
    causes: list
    subject: str = "ddp"
    weight: float | None = None  # tested verdicts weighted by their share of generated programs run
    programs_run: int = 0
    programs_left: dict = field(default_factory=dict)  # cause -> generated programs left out

    @property
    def share(self) -> float:
        """Tested share in [0, 1] (1.0 for no verdict: nothing was left out); a generated-scenario
        verdict counts in the share of its scenarios that ran."""
        tested = self.tested if self.weight is None else self.weight
        return tested / self.verdicts if self.verdicts else 1.0

    def text(self, top: int = 3) -> str:
        """One line: ``coverage ref: 452 of 468 verdicts tested (96.6 %); not tested: ...``."""
        who = self.impl if self.subject == "ddp" else f"{self.subject} {self.impl}"
        s = f"coverage {who}: {self.tested} of {self.verdicts} verdicts tested"
        left = sum(self.programs_left.values())
        if left:
            s += f", {self.programs_run} of {self.programs_run + left} generated programs run"
        s += f" ({100 * self.share:.1f} %)"
        if left:
            causes = sorted(self.programs_left.items(), key=lambda kv: -kv[1])
            s += "; programs left out: " + "; ".join(f"{c}: {n}" for c, n in causes[:top])
        if self.causes:
            s += "; not tested: " + "; ".join(c.text() for c in self.causes[:top])
            if len(self.causes) > top:
                s += f"; +{len(self.causes) - top} more cause(s) in the JSON report"
        return s

    def to_json(self) -> dict:
        return {"impl": self.impl, "subject": self.subject, "verdicts": self.verdicts, "tested": self.tested,
                "share": round(self.share, 6), "causes": [c.__dict__ for c in self.causes],
                "programs": {"run": self.programs_run, "left_out": dict(self.programs_left)}}


def coverage(verdicts: list[Verdict]) -> list[Coverage]:
    """Per implementation, in order of first appearance."""
    out: dict[str, dict] = {}
    for v in verdicts:
        d = out.setdefault((v.subject, v.impl), {"n": 0, "tested": 0, "weight": 0.0, "causes": {}, "runs": {}})
        d["n"] += 1
        if v.status in TESTED:
            d["tested"] += 1
            d["weight"] += _program_share(v)
            if v.programs:  # once per case run: its checks share the scenarios
                d["runs"][(v.case, v.runtime, v.world_size)] = v.programs
        elif v.status in UNTESTED:
            c = d["causes"].setdefault((v.status, cause_of(v)), {"n": 0, "cases": set(), "families": set()})
            c["n"] += 1
            c["cases"].add(v.case)
            c["families"].add(v.family or v.case.split(".")[0])
    result = []
    for (subject, impl), d in out.items():
        causes = [Cause(st, cause, c["n"], sorted(c["cases"]), sorted(c["families"]))
                  for (st, cause), c in d["causes"].items()]
        causes.sort(key=lambda c: (-c.verdicts, c.status, c.cause))
        left: dict = {}
        for p in d["runs"].values():
            for cause, n in p.get("left_out", {}).items():
                left[cause_words(cause)] = left.get(cause_words(cause), 0) + n
        result.append(Coverage(impl, d["n"], d["tested"], causes, subject, d["weight"],
                               sum(p.get("run", 0) for p in d["runs"].values()), left))
    return result


def _program_share(v: Verdict) -> float:
    """1 for a tested verdict, or the share of its generated programs that ran."""
    run, left = v.programs.get("run", 0), sum(v.programs.get("left_out", {}).values())
    return run / (run + left) if run + left else 1.0


def cause_words(text: str) -> str:
    """A program-left-out cause cut like an untested verdict's (:func:`cause_of`)."""
    for head in _CAUSE_HEADS:
        m = re.search(head, text)
        if m:
            return text[:text.index(":") + 1] + " " + m.group(0) if ":" in text[:m.start()] else m.group(0)
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS - 3] + "..."


def unmet_requirements(verdicts: list[Verdict], required: list[str]) -> list[Verdict]:
    """The ``unsupported`` verdicts a ``--require-supported`` list rules out: every one for
    ``all``, else those whose cause contains one of the ``required`` words (a keyword or a
    method name, e.g. ``find_unused_parameters``, ``join``)."""
    unsup = [v for v in verdicts if v.status == "unsupported"]
    if "all" in required:
        return unsup
    return [v for v in unsup if any(word in cause_of(v) for word in required)]
