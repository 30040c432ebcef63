"""A run's terminal text, the writer :class:`conformance.report.writers.TerminalText` prints
(:func:`write_terminal`), read from the run's :class:`~conformance.report.writers.RunOutput`.
Imports no torch at import (the DDP surface's summary does, when a run has tested cases).
"""
from __future__ import annotations

import sys
from collections import Counter

from conformance.report.causes import shared_cause
from conformance.report.coverage import TESTED, coverage, unmet_requirements
from conformance.report.kills import KILLED, SURVIVED, UNSUPPORTED, kill_summary
from conformance.report.text import backend_section, counts, kill_matrix_text, verdict_table
from conformance.verdict import BAD

#: Reproduce commands printed under the table (all of them go to the failures file).
REPRO_LINES = 5


def _judged(out) -> bool:
    """Whether the backend's verdicts decide the exit code (the JSON's ``backend.judged``)."""
    return bool((out.extra.get("backend") or {}).get("judged", False))


def verdict_lines(out) -> list[str]:
    """What the run found - the cause most failures share, the verdict table, the backend's
    verdicts apart, ``--model``'s bounds, reproduce commands, the kill matrix, where ``-x`` /
    ``--exitfirst-each`` stopped - each item printed as one ``print`` (it may hold newlines)."""
    verdicts, extra = out.verdicts, out.extra
    lines = []
    shared = shared_cause(verdicts)  # one fault behind most failures: said first
    if shared:
        lines.append(shared.text())
    lines.append(verdict_table([v for v in verdicts if v.subject != "backend"]))
    section = backend_section(verdicts, _judged(out))
    if section:
        lines.append(section)
    lines += out.notes
    repros = list(dict.fromkeys(out.repro(v) for v in verdicts if v.status in BAD))
    if repros:
        lines.append("\nreproduce one failing case:")
        lines.append("\n".join(f"  {c}" for c in repros[:REPRO_LINES]))
        if len(repros) > REPRO_LINES:
            lines.append(f"  ... {len(repros) - REPRO_LINES} more in the failures file")
    if out.kills:
        lines.append("\nmutant kill matrix (every catalog mutant x every case that must kill it)")
        lines.append(kill_matrix_text(out.kills))
    if extra.get("stopped_at"):
        lines.append(f"\nstopped at the first failure (--exitfirst): {extra['stopped_at']}; later cases not run")
    for impl, vid in (extra.get("stopped_at_each") or {}).items():
        lines.append(f"\n{impl}: stopped at its first failure (--exitfirst-each): {vid}")
    return lines


def where_lines(out) -> list[str]:
    """Where the JSON report (``stdout`` with ``--json -``) and the JUnit XML went (the targets
    :func:`conformance.report.writers.write_all` wrote)."""
    targets = out.targets
    if "json" not in targets:
        return []
    json = targets["json"]
    return [f"\nJSON report: {'stdout' if hasattr(json, 'write') else json}"
            + (f"; JUnit XML: {targets['junit']}" if targets.get("junit") else "")]


def summary_lines(out) -> list[str]:
    """The counts line (and the kill summary's), the backend's counts, the coverage lines and the
    unsupported verdicts ``--require-supported`` names (the JSON's ``require_supported``)."""
    verdicts = out.verdicts
    mine = [v for v in verdicts if v.subject != "backend"]
    ks = Counter(kill_summary(out.kills).values())
    lines = [", ".join(f"{n} {s}" for s, n in counts(mine).items() if n or s in ("pass", "fail"))
             + (f"; mutants: {ks[KILLED]} killed, {ks[SURVIVED]} survived, {ks[UNSUPPORTED]} unsupported"
                if out.kills else "")]
    backend = [v for v in verdicts if v.subject == "backend"]
    if backend:
        lines.append("backend " + ", ".join(f"{n} {s}" for s, n in counts(backend).items() if n)
                     + ("" if _judged(out) else " (reported apart: --fail-on-backend counts them)"))
    lines += [cov.text() for cov in coverage(verdicts)]
    tested = {v.case for v in mine if v.status in TESTED}
    if tested:
        from conformance.cases.surface import summary as surface_summary  # the scenario format: torch
        lines.append(surface_summary(tested))
    cpu_worlds = {v.world_size for v in mine if v.runtime == "cpu" and v.status in TESTED and v.world_size}
    if cpu_worlds:
        from conformance.worlds.launchers import coverage_line
        lines.append(coverage_line(cpu_worlds))
    required = out.extra.get("require_supported") or []
    unmet = unmet_requirements(verdicts, required)
    if unmet:
        lines.append(f"--require-supported {','.join(required)}: {len(unmet)} verdict(s) unsupported, "
                     f"e.g. {unmet[0].id}: {unmet[0].reason.splitlines()[0] if unmet[0].reason else ''}")
    return lines


def write_terminal(stream, out) -> None:
    """Print the run's terminal text to ``stream``: :func:`verdict_lines`, the lines the writers
    before it returned (``out.lines``: the files they wrote), ``out.warnings`` (``warning: ...``,
    to stderr), :func:`where_lines` and :func:`summary_lines`."""
    for line in verdict_lines(out) + list(out.lines):
        print(line, file=stream)
    for text in out.warnings:
        print(f"warning: {text}", file=sys.stderr)
    for line in where_lines(out) + summary_lines(out):
        print(line, file=stream)
    stream.flush()
