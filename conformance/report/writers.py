"""Report writers behind one interface: what a run produced (:class:`RunOutput`) goes to each
selected :class:`Writer` in :data:`ORDER`; the ``run`` command, ``replay`` and ``python -m
conformance report`` share them. A new format is one class here and one entry of
:data:`WRITERS`.

Order matters: replay files are written first (the diagnoses then name them, in the JSON and in
the failures text), and the JSON document's ``created`` stamp is the JUnit suites' timestamp.
"""
from __future__ import annotations

import json as _json
import os
from dataclasses import dataclass, field
from typing import Callable

from conformance.cases.semantics import expected_behaviour
from conformance.cases.table import CASES
from conformance.cli.output import side_file
from conformance.outcome import repro_command
from conformance.report.html import write_report
from conformance.report.junit import write_junit
from conformance.report.text import build_json, write_json_doc


@dataclass
class RunOutput:
    """Verdicts and kill rows of a run, the JSON report's extra keys (``extra``), per case run
    seconds (``seconds``: ``(case, impl, runtime, W) -> s``, for JUnit), the signal name that cut
    it short (``interrupted``) and the command that reproduces a verdict (``repro``)."""

    verdicts: list
    kills: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    interrupted: str | None = None
    repro: Callable = repro_command
    #: filled by the JSON writer: the document written (its ``created`` stamps JUnit)
    doc: dict | None = None


class Writer:
    """One report format. ``write(out)`` writes it and returns the lines to print (a path
    written, a reproduce command); ``target`` is the path (``-`` or a stream: stdout)."""

    name = ""

    def __init__(self, target):
        self.target = target

    def write(self, out: RunOutput) -> list[str]:
        raise NotImplementedError


class ScenarioFiles(Writer):
    """Each scenario a failing scenario verdict was judged on, as a replayable file beside the
    JSON (``<stem>.<case>-<impl>-<runtime>-w<W>[-<check>].json``; none with ``--json -``); every
    diagnosis of the case names its file instead of the ``SCENARIO.json`` placeholder."""

    name = "scenarios"

    def write(self, out: RunOutput) -> list[str]:
        if side_file(self.target, "") is None:
            return []
        verdicts = out.verdicts
        failing = {(v.case, v.impl, v.runtime, v.world_size) for v in verdicts
                   if v.example is not None and v.status in ("fail", "xfail")}
        written, lines = {}, []  # (key, scenario JSON text) -> path
        for v in sorted((v for v in verdicts if v.example is not None),
                        key=lambda v: v.status not in ("fail", "xfail")):
            key = (v.case, v.impl, v.runtime, v.world_size)
            if key not in failing:
                continue
            blob = _json.dumps(v.example, sort_keys=True)
            if (key, blob) not in written:
                name = f"{v.case}-{v.impl}-{v.runtime}-w{v.world_size}".replace(":", "_").replace("/", "_")
                first = not any(k == key for k, _ in written)
                if not first:  # a second scenario of this case: named by its check
                    name += f"-{v.check}"
                path = written[(key, blob)] = side_file(self.target, f".{name}.json")
                with open(path, "w") as f:
                    _json.dump({"case": v.case, "impl": v.impl, "runtime": v.runtime, "scenario": v.example},
                               f, indent=1)
                lines.append(f"{'minimal failing' if first else 'failing'} scenario: {path}\n  reproduce: "
                             f"python -m conformance replay {path} --ddp {v.impl} --runtime {v.runtime}")
            v.diagnosis = v.diagnosis.replace("SCENARIO.json", written[(key, blob)])
        return lines


class JsonReport(Writer):
    """The JSON run report (docs/report-format.md), written whole (temporary file, rename) or to
    a stream (``--json -``)."""

    name = "json"

    def write(self, out: RunOutput) -> list[str]:
        out.doc = build_json(out.verdicts, out.kills, out.extra)
        write_json_doc(self.target, out.doc)
        return []


class FailuresText(Writer):
    """Every failing verdict (fail, vacuous, xfail) beside the JSON, ``<stem>.failures.txt``:
    its summary, what the reference does (:mod:`conformance.cases.semantics`), the command that
    reproduces it and its full failure text (replica tracebacks, stacks, counterexamples); none
    with ``--json -``; a stale file from an earlier run is removed when nothing failed."""

    name = "failures"

    def write(self, out: RunOutput) -> list[str]:
        verdicts = list(out.verdicts) + [v for k in out.kills for v in k.verdicts]
        failing = [v for v in verdicts if v.status in ("fail", "xfail", "vacuous")]
        path = side_file(self.target, ".failures.txt")
        if path is None:
            return []
        if not failing:
            if os.path.exists(path):
                os.remove(path)
            return []
        groups: dict = {}  # the checks of one case run that share a failure text are written together

        def expected(v):
            text = expected_behaviour(CASES.get(v.case), v.check)
            return f"    expected: {text}\n" if text else ""
        for v in failing:
            groups.setdefault((v.case, v.impl, v.runtime, v.world_size, v.diagnosis), []).append(v)
        parts = ["".join(f"=== {v.id}: {v.status}: {v.reason}\n{expected(v)}" for v in vs)
                 + f"reproduce: {out.repro(vs[0])}\n" + (f"{vs[0].diagnosis}\n" if vs[0].diagnosis else "")
                 for vs in groups.values()]
        with open(path, "w") as f:
            f.write("\n".join(parts))
        return [f"failure details: {path}"]


class JUnitXml(Writer):
    """JUnit XML: one testcase per verdict and kill-matrix cell (:mod:`conformance.report.junit`)."""

    name = "junit"

    def write(self, out: RunOutput) -> list[str]:
        write_junit(self.target, out.verdicts, out.kills, seconds=out.seconds,
                    created=(out.doc or {}).get("created"), interrupted=out.interrupted, repro=out.repro)
        return []


class HtmlReport(Writer):
    """The self-contained HTML report (tables, coverage, sensitivity plot) into the folder
    ``target`` (:func:`conformance.report.html.write_report`; needs matplotlib)."""

    name = "html"

    def write(self, out: RunOutput) -> list[str]:
        doc = out.doc or build_json(out.verdicts, out.kills, out.extra)
        paths = write_report([doc], [], self.target, sources=[])
        return [f"{k}: {p}" for k, p in paths.items()]


#: name -> writer class; ORDER is the order a run writes them in (see the module docstring).
WRITERS = {w.name: w for w in (ScenarioFiles, JsonReport, FailuresText, JUnitXml, HtmlReport)}
ORDER = ("scenarios", "json", "failures", "junit", "html")


def write_all(out: RunOutput, targets: dict) -> list[str]:
    """Write ``out`` with every writer named in ``targets`` (``{name: target}``), in
    :data:`ORDER`; the lines to print, in that order."""
    unknown = sorted(set(targets) - set(WRITERS))
    if unknown:
        raise ValueError(f"unknown report writer(s) {unknown}; known: {', '.join(ORDER)}")
    lines = []
    for name in ORDER:
        if name in targets:
            lines += WRITERS[name](targets[name]).write(out)
    return lines
