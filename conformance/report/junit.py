"""JUnit XML of a run (``python -m conformance run --junitxml FILE``), for CI test views.

One ``<testcase>`` per verdict: ``classname`` is the case (``parity.linear``), ``name`` is
``<check>[<impl>-<runtime>-w<W>]`` (so ``classname:name`` is the verdict id); fail and vacuous
are a ``<failure type="fail|vacuous" message="reason">`` holding the summary, the failure text
and ``reproduce: <command>``, unsupported and skip a ``<skipped type="unsupported|skip">``, xfail a
``<skipped type="pytest.xfail">`` (as pytest writes it); docs/configuration.md, ``--junitxml``.

With ``--mutants`` a second ``<testsuite>`` holds the kill matrix: one ``<testcase>`` per
(mutant, case that must kill it), ``classname`` ``mutant.<name>``, ``name``
``<case>[<runtime>-w<W>]``; a survived cell is a ``<failure>``, one that could not run is
``<skipped>``. The backend beneath the DDPs (verdicts whose ``subject`` is ``backend``: the
collective family) has a ``<testsuite>`` of its own, ``conformance-backend``, whose property
``judged`` says whether its failures decided the exit code. A case's time is shared equally
among its verdicts.
"""
from __future__ import annotations

import re
import socket
from collections import Counter
import xml.etree.ElementTree as ET

from conformance.outcome import repro_command
from conformance.report.kills import SKIP, SURVIVED, UNSUPPORTED
from conformance.report.text import replaced
from conformance.verdict import BAD

# XML 1.0 forbids most control characters (tracebacks and log tails may hold them).
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text) -> str:
    return _BAD_XML.sub("?", str(text or ""))


def _suite(name: str, cases: list, timestamp: str | None, properties: dict) -> ET.Element:
    suite = ET.Element("testsuite", name=name)
    failures = sum(tc.find("failure") is not None for tc in cases)
    skipped = sum(tc.find("failure") is None and tc.find("skipped") is not None for tc in cases)
    for k, n in (("tests", len(cases)), ("failures", failures), ("errors", 0), ("skipped", skipped)):
        suite.set(k, str(n))
    suite.set("time", f"{sum(float(tc.get('time', 0)) for tc in cases):.3f}")
    if timestamp:
        suite.set("timestamp", timestamp)
    suite.set("hostname", socket.gethostname())
    if properties:
        props = ET.SubElement(suite, "properties")
        for k, v in properties.items():
            ET.SubElement(props, "property", name=k, value=_clean(v))
    suite.extend(cases)
    return suite


def verdict_testcase(v, seconds: float = 0.0, repro=repro_command) -> ET.Element:
    tc = ET.Element("testcase", classname=v.case,
                    name=f"{v.check}[{v.impl}-{v.runtime}-w{v.world_size}]", time=f"{seconds:.3f}")
    if v.status in BAD:
        f = ET.SubElement(tc, "failure", type=v.status, message=_clean(v.reason or v.status))
        f.text = _clean(v.summary() + ("\n\n" + v.diagnosis if v.diagnosis else "")
                        + "\n\nreproduce: " + repro(v))
    elif v.status in ("unsupported", "skip"):
        ET.SubElement(tc, "skipped", type=v.status, message=_clean(v.reason or v.status))
    elif v.status == "xfail":
        ET.SubElement(tc, "skipped", type="pytest.xfail", message=_clean(v.reason or "expected failure"))
    return tc


def kill_testcase(row) -> ET.Element:
    tc = ET.Element("testcase", classname=f"mutant.{row.mutant}",
                    name=f"{row.case}[{row.runtime}-w{row.world_size}]", time="0.000")
    if row.result == SURVIVED:
        f = ET.SubElement(tc, "failure", type=SURVIVED,
                          message=_clean(f"mutant {row.mutant} survived {row.case}, which must kill it"))
        f.text = _clean("\n".join(v.summary() for v in row.verdicts))
    elif row.result in (UNSUPPORTED, SKIP):
        ET.SubElement(tc, "skipped", type=row.result, message=_clean(row.reason()))
    return tc


def build_junit(verdicts, kill_rows=(), *, seconds: dict | None = None, created: str | None = None,
                interrupted: str | None = None, repro=repro_command,
                backend_judged: bool = False) -> ET.ElementTree:
    """The JUnit tree. ``seconds`` maps ``(case, impl, runtime, W)`` to the time its evaluation
    took; ``interrupted`` names the signal that cut the run short (a suite property); ``repro``
    gives a failing verdict's reproduce command; ``backend_judged``: the run's exit code counts
    the backend's failures (``--fail-on-backend``, a ``--backend`` under test)."""
    seconds = seconds or {}
    per_case = Counter((v.case, v.impl, v.runtime, v.world_size) for v in verdicts)  # verdicts per case run
    props = {"interrupted": interrupted} if interrupted else {}
    root = ET.Element("testsuites", name="ddp-conformance")

    def cases(subject):
        return [verdict_testcase(v, seconds.get((v.case, v.impl, v.runtime, v.world_size), 0.0)
                                 / per_case[(v.case, v.impl, v.runtime, v.world_size)], repro)
                for v in verdicts if (v.subject == "backend") == (subject == "backend")]
    root.append(_suite("conformance", cases("ddp"), created, props))
    if any(v.subject == "backend" for v in verdicts):
        root.append(_suite("conformance-backend", cases("backend"), created,
                           {**props, "judged": str(backend_judged).lower()}))
    if kill_rows:
        root.append(_suite("conformance-kill-matrix", [kill_testcase(r) for r in kill_rows], created, props))
    for k in ("tests", "failures", "errors", "skipped"):
        root.set(k, str(sum(int(s.get(k)) for s in root)))
    root.set("time", f"{sum(float(s.get('time')) for s in root):.3f}")
    return ET.ElementTree(root)


def write_junit(path: str, verdicts, kill_rows=(), **kw) -> None:
    """Write :func:`build_junit`'s tree to ``path`` (a temporary file, then renamed)."""
    tree = build_junit(verdicts, kill_rows, **kw)
    ET.indent(tree)
    with replaced(path) as f:
        tree.write(f, encoding="utf-8", xml_declaration=True)
