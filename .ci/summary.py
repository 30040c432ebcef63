"""Print, last, what failed in the tox environments CI just ran: CI keeps only the tail of
the log, and a failure of the first environment scrolls out behind the second one's output.

Reads each environment's ``tmp`` folder: pytest's JUnit XML files (``--junitxml``) and the
kit's JSON reports (``python -m conformance run --json``). Standard library only.
Usage: ``python .ci/summary.py [TOX_WORK_DIR]`` (default ``.tox``); always exits 0.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

MAX_LINES = 12  # per environment: the tail CI keeps is short


def _first_line(text: str | None) -> str:
    text = (text or "").strip()
    return text.splitlines()[0][:160] if text else ""


def junit_failures(path: str) -> list[str]:
    """``id: message`` of every failed or erroring test case of one JUnit XML file."""
    out = []
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        return [f"{os.path.basename(path)}: unreadable ({exc})"]
    for case in root.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            out.append(f"{name}: {_first_line(bad.get('message') or bad.text)}")
    return out


def report_failures(path: str) -> list[str]:
    """``id: status: reason`` of every verdict of one kit report that made its run exit 1."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"{os.path.basename(path)}: unreadable ({exc})"]
    return [f"{v.get('id')}: {v.get('status')}: {_first_line(v.get('reason'))}"
            for v in doc.get("verdicts", []) if v.get("status") in ("fail", "vacuous")]


def main(work: str) -> None:
    for env in sorted(glob.glob(os.path.join(work, "*", "tmp"))):
        name = os.path.basename(os.path.dirname(env))
        lines = []
        for path in sorted(glob.glob(os.path.join(env, "junit-*.xml"))):
            lines += [f"[{os.path.basename(path)}] {x}" for x in junit_failures(path)]
        for path in sorted(glob.glob(os.path.join(env, "*.json"))):
            lines += [f"[{os.path.basename(path)}] {x}" for x in report_failures(path)]
        if not lines:
            continue
        print(f"=== {name}: {len(lines)} failure(s)")
        for line in lines[:MAX_LINES]:
            print(f"  {line}")
        if len(lines) > MAX_LINES:
            print(f"  ... and {len(lines) - MAX_LINES} more")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".tox")
