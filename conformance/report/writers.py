"""Report writers behind one interface: what a run produced (:class:`RunOutput`) goes to each
selected :class:`Writer` in registration order (:data:`WRITERS`); the ``run`` command,
``replay``, the pytest face (``--conformance-json``) and ``python -m conformance report`` share
them. A new format is its :class:`Writer` subclass and one registration (:func:`register`, or a
line of :data:`WRITERS`); the run's targets and ``report``'s ``--format`` choices, help and files
derive from what the class declares.

Order matters: scenario files are written first (the diagnoses then name them, in the JSON and
in the failures text), the JSON document's ``created`` stamp is the JUnit suites' timestamp, and
the terminal text comes last (it prints what the writers before it said).
This module imports no torch (the CLI builds ``report --format`` from it before torch loads).
"""
from __future__ import annotations

import json as _json
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from conformance.cases.semantics import expected_behaviour
from conformance.errors import UsageError
from conformance.outcome import repro_command
from conformance.report.html import write_report
from conformance.report.junit import write_junit
from conformance.report.terminal import write_terminal
from conformance.report.text import build_json, write_json_doc


def side_file(json_path: str, suffix: str) -> str | None:
    """``<json stem><suffix>`` next to the report, or ``None`` with ``--json -`` (the JSON on
    stdout holds everything: failure texts in ``diagnosis``, scenarios in ``example``)."""
    if json_path == "-":  # conformance.cli.output.STDOUT
        return None
    return os.path.splitext(json_path)[0] + suffix


@dataclass
class RunOutput:
    """Verdicts and kill rows of a run, the JSON report's extra keys (``extra``), per case run
    seconds (``seconds``: ``(case, impl, runtime, W) -> s``, for JUnit), the signal name that cut
    it short (``interrupted``) and the command that reproduces a verdict (``repro``); for the
    terminal text, lines to say under the verdict table (``notes``) and warnings (``warnings``)."""

    verdicts: list
    kills: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    interrupted: str | None = None
    repro: Callable = repro_command
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    #: filled by the JSON writer: the document written (its ``created`` stamps JUnit)
    doc: dict | None = None
    #: ``python -m conformance report``: the run JSON documents as read (HTML shows them
    #: unmerged), the calibration documents and the input paths
    runs: list | None = None
    calibrations: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    #: filled by :func:`write_all`: the targets it writes (``{name: target}``) and the lines the
    #: writers written so far returned (what the terminal text prints of them)
    targets: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)


class Writer:
    """One report format. ``write(out)`` writes it and returns the lines to print (a path
    written, a reproduce command); ``target`` is the path (``-`` or a stream: stdout).

    What a subclass declares (the run and ``report`` read nothing else):

    * ``name``: its key in :data:`WRITERS` and its ``report --format`` choice;
    * ``suffix``: the file it writes after a report's stem: beside a run's ``--json PATH``
      (``<stem><suffix>``) and as ``report<suffix>`` in ``report --out DIR``;
    * ``run``: a run (``python -m conformance run``) writes it; ``report``: ``python -m
      conformance report --format NAME`` offers it; ``says``: its few words in that help;
    * ``calibration``: it shows calibration JSON (``report --calibration``).

    :meth:`run_target` and :meth:`report_target` turn those into its target; a writer whose
    target is not its own file (the JSON's path, a folder, a flag) overrides them.
    """

    name = ""
    suffix = ""
    run = False
    report = True
    says = ""
    calibration = False

    def __init__(self, target):
        self.target = target

    def write(self, out: RunOutput) -> list[str]:
        raise NotImplementedError

    @classmethod
    def run_target(cls, json: str, json_out=None, options=None):
        """Its target in a run whose JSON report is ``json`` (``-``: the stream ``json_out``)
        with options ``options`` (:class:`conformance.cli.RunOptions`, or ``None``); ``None``:
        not written. By default ``<json stem><suffix>``, and nothing with ``--json -``."""
        return side_file(json, cls.suffix)

    @classmethod
    def report_target(cls, folder: str):
        """Its target for ``python -m conformance report --out folder``."""
        return os.path.join(folder, "report" + cls.suffix)

    @classmethod
    def check(cls) -> None:
        """Raise :class:`conformance.errors.UsageError` when it cannot write here (before any
        input beyond the run JSON is read)."""


class ScenarioFiles(Writer):
    """Each scenario a failing scenario verdict was judged on, as a replayable file beside the
    JSON (``<stem>.<case>-<impl>-<runtime>-w<W>[-<check>].json``; none with ``--json -``); every
    diagnosis of the case names its file instead of the ``SCENARIO.json`` placeholder."""

    name = "scenarios"
    suffix = ".<case>-<impl>-<runtime>-w<W>.json"  # one file per failing scenario
    run, report = True, False

    @classmethod
    def run_target(cls, json, json_out=None, options=None):
        return json  # the JSON's path: the files go beside it (none with --json -)

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
    suffix = ".json"
    run = report = True
    says = "the runs merged"

    @classmethod
    def run_target(cls, json, json_out=None, options=None):
        return json_out or json

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
    suffix = ".failures.txt"
    run = report = True
    says = "text"

    @classmethod
    def run_target(cls, json, json_out=None, options=None):
        return json  # the JSON's path: it writes <stem>.failures.txt beside it

    @classmethod
    def report_target(cls, folder):
        return os.path.join(folder, "report.json")

    def write(self, out: RunOutput) -> list[str]:
        from conformance.cases.table import CASES  # the case table imports torch
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
    suffix = ".xml"
    run = report = True
    says = "XML"

    @classmethod
    def run_target(cls, json, json_out=None, options=None):
        return getattr(options, "junitxml", None) or None  # --junitxml FILE

    @classmethod
    def report_target(cls, folder):
        return os.path.join(folder, "junit.xml")

    def write(self, out: RunOutput) -> list[str]:
        write_junit(self.target, out.verdicts, out.kills, seconds=out.seconds,
                    created=(out.doc or {}).get("created"), interrupted=out.interrupted, repro=out.repro,
                    backend_judged=((out.doc or {}).get("backend") or {}).get("judged", False))
        return []


class HtmlReport(Writer):
    """The self-contained HTML report (tables, coverage, sensitivity plot) into the folder
    ``target`` (:func:`conformance.report.html.write_report`; needs matplotlib)."""

    name = "html"
    suffix = ""  # a folder: report.html and its figures
    run, report = False, True
    says = "tables, coverage, sensitivity plot"
    calibration = True

    @classmethod
    def report_target(cls, folder):
        return folder

    @classmethod
    def check(cls):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("report needs matplotlib: pip install -e '.[report]' (from a clone)") from None

    def write(self, out: RunOutput) -> list[str]:
        runs = out.runs if out.runs is not None else [out.doc or build_json(out.verdicts, out.kills, out.extra)]
        paths = write_report(runs, out.calibrations, self.target, sources=out.sources)
        return [f"{k}: {p}" for k, p in paths.items()]


class TerminalText(Writer):
    """What a run prints (:mod:`conformance.report.terminal`): the verdict table, the kill matrix,
    the lines of the writers before it, where the reports are, the summary and the coverage lines;
    to stdout (``-``; with ``--json -`` stdout is the JSON and this text goes to stderr) or a
    stream. Always the last writer: it prints what the others said."""

    name = "terminal"
    suffix = ""  # no file
    run, report = True, False

    @classmethod
    def run_target(cls, json, json_out=None, options=None):
        return "-"  # conformance.cli.output.STDOUT: sys.stdout when written

    def write(self, out: RunOutput) -> list[str]:
        write_terminal(sys.stdout if self.target == "-" else self.target, out)
        return []


#: name -> writer class, in the order a run writes them (see the module docstring). A new format:
#: one more class in this tuple, or ``register(MyWriter)``; the terminal text stays last.
WRITERS = {w.name: w for w in (ScenarioFiles, JsonReport, FailuresText, JUnitXml, HtmlReport, TerminalText)}
#: the ``report --format`` default
DEFAULT_REPORT_FORMAT = "html"


def register(writer: type[Writer]) -> type[Writer]:
    """Add ``writer`` to :data:`WRITERS` (after the built-in ones, before the terminal text, which
    prints what it says; usable as a decorator)."""
    if not writer.name or writer.name in WRITERS:
        raise ValueError(f"report writer name {writer.name!r}: empty or taken ({', '.join(WRITERS)})")
    WRITERS[writer.name] = writer
    if TerminalText.name in WRITERS:
        WRITERS[TerminalText.name] = WRITERS.pop(TerminalText.name)
    return writer


def report_formats() -> tuple[str, ...]:
    """``report --format`` choices: the default first, then every other report-time writer."""
    return (DEFAULT_REPORT_FORMAT,) + tuple(n for n, w in WRITERS.items()
                                            if w.report and n != DEFAULT_REPORT_FORMAT)


def report_formats_help() -> str:
    """``report --format``'s help, from each writer's ``says``."""
    said = [f"{n} ({'default: ' if n == DEFAULT_REPORT_FORMAT else ''}{WRITERS[n].says})" for n in report_formats()]
    return ", ".join(said[:-1]) + f" or {said[-1]}, written by the same writers as run"  # html, json, ...


def run_targets(json: str, json_out=None, options=None) -> dict:
    """``{name: target}`` of every writer a run writes (:meth:`Writer.run_target`)."""
    targets = {n: w.run_target(json, json_out, options) for n, w in WRITERS.items() if w.run}
    return {n: t for n, t in targets.items() if t is not None}


def write_all(out: RunOutput, targets: dict) -> list[str]:
    """Write ``out`` with every writer named in ``targets`` (``{name: target}``), in
    :data:`WRITERS`' order; the lines to print, in that order."""
    unknown = sorted(set(targets) - set(WRITERS))
    if unknown:
        raise ValueError(f"unknown report writer(s) {unknown}; known: {', '.join(WRITERS)}")
    out.targets, out.lines = dict(targets), []
    for name, writer in WRITERS.items():
        if name in targets:
            out.lines += writer(targets[name]).write(out)
    return list(out.lines)
