"""Run JSON documents read back (what ``python -m conformance run --json`` and ``pytest
--conformance-json`` write): loaded, merged, counted and labelled per implementation under
test, and the per-step series the report's sensitivity figure draws. What
:mod:`conformance.report.html` and ``python -m conformance report`` read; no matplotlib."""
from __future__ import annotations

import json
import math

from conformance.errors import UsageError
from conformance.report.coverage import UNTESTED
from conformance.verdict import BAD, STATUSES


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: not a conformance JSON object")
    return doc


def load_documents(paths: list[str], key: str, what: str) -> list[dict]:
    """The JSON documents at ``paths`` (runs' or calibrations'), as read; each must hold ``key``
    (``what`` names such a document and where it comes from, for the error).

    Raises:
        UsageError: one cannot be read, is not JSON, is not a JSON object or has no ``key`` (one line).
    """
    docs = [_load(p) for p in paths]
    for path, doc in zip(paths, docs):
        if key not in doc:
            raise UsageError(f"{path}: no {key!r} key: not a {what}")
    return docs


def verdict_id(v: dict) -> str:
    """A JSON verdict's id (``Verdict.id``), also of a document written without it."""
    return v.get("id") or f"{v['case']}:{v['check']}[{v['impl']}-{v['runtime']}-w{v['world_size']}]"


def merge_runs(docs: list[dict]) -> dict:
    """Verdicts and kill-matrix rows of several run JSON files. A verdict id seen
    twice (the same run given twice, overlapping runs) keeps the later input's
    verdict once: counts and tables show each verdict id once. ``backend_judged``: whether a
    failing verdict of the backend (``subject`` ``backend``) decided an input's exit code."""
    by_id, kills, envs, dups, judged = {}, [], [], 0, False
    for d in docs:
        for v in d.get("verdicts", []):
            vid = verdict_id(v)
            dups += vid in by_id
            by_id[vid] = v
        kills += d.get("kill_matrix", [])
        judged = judged or (d.get("backend") or {}).get("judged", False)
        if d.get("environment"):
            envs.append(d["environment"])
    return {"verdicts": list(by_id.values()), "kill_matrix": kills, "environments": envs,
            "duplicates": dups, "backend_judged": judged}


def impl_counts(verdicts: list[dict]) -> dict:
    """``{impl: {status: n}}`` in first-seen order: every implementation under test
    (every ``impl`` of ``verdicts``, a ``mutant:`` named with ``--ddp`` included) on
    its own; nothing is summed across implementations."""
    out: dict = {}
    for v in verdicts:
        c = out.setdefault(v["impl"], dict.fromkeys(STATUSES, 0))
        c[v["status"]] = c.get(v["status"], 0) + 1
    return out


def is_backend(verdicts: list[dict], impl: str) -> bool:
    return any(v["impl"] == impl and v.get("subject") == "backend" for v in verdicts)


def impl_label(counts: dict) -> str:
    """What the verdicts say about one implementation: ``correct`` only when no verdict
    is ``fail`` or ``vacuous`` (BAD), none is an expected failure and something passed."""
    bad = [f"{counts[s]} {s}" for s in BAD if counts.get(s)]
    if bad:
        return "NOT conformant: " + ", ".join(bad)
    if counts.get("xfail"):
        return f"correct except {counts['xfail']} expected failure(s)"
    if not counts.get("pass"):
        return "nothing checked (no verdict passed)"
    untested = sum(counts.get(s, 0) for s in UNTESTED)
    if untested:  # a pass on part of the table says how much of it
        total = sum(counts.values())
        return f"correct on {100 * (total - untested) / total:.1f} % of its verdicts ({untested} not tested)"
    return "correct"


def is_correct(label: str) -> bool:
    """An :func:`impl_label` of a conformant implementation (on all or part of the table)."""
    return label == "correct" or label.startswith("correct on ")


def _panel(v: dict) -> str:
    return f"{v['runtime']}-w{v['world_size']}"


def _signal_check(vs: list[dict]) -> dict | None:
    """Of a mutant's verdicts on one model: ``param_parity`` if it fails (comparable
    with the correct runs' line), else the failing check with the largest deviation
    relative to its atol, else ``param_parity``."""
    failing = [v for v in vs if v["status"] == "fail" and v.get("per_step")]
    if any(v["check"] == "param_parity" for v in failing):
        failing = [v for v in failing if v["check"] == "param_parity"]
    if failing:
        return max(failing, key=lambda v: (v["max_dev"] or math.inf) / (v["atol"] or 1.0))
    pp = [v for v in vs if v["check"] == "param_parity" and v.get("per_step")]
    return pp[0] if pp else None


def sensitivity_series(run: dict) -> dict:
    """``{panel: {model: {"atol": float, "lines": [(label, kind, per_step)]}}}``.

    Implementations under test (``verdicts``) are labelled from their verdicts
    (:func:`impl_label`): ``"<impl> (correct)"``, kind ``correct``, only when none of
    them failed or was vacuous; any other is kind ``failing`` and drawn like a mutant
    (its failing check with the largest deviation). Kill-matrix mutants are kind
    ``mutant``."""
    out: dict = {}

    def slot(v):
        return out.setdefault(_panel(v), {}).setdefault(v["model"], {"atol": None, "lines": []})

    counts = impl_counts(run["verdicts"])
    labels = {impl: impl_label(c) for impl, c in counts.items()}
    by_line: dict = {}   # (panel, name, kind, model) -> parity verdicts
    for v in run["verdicts"]:
        if v.get("family") != "parity" or v["check"] == "agreement":  # parity trajectories only
            continue
        if is_correct(labels[v["impl"]]):
            if v["check"] == "param_parity" and v.get("per_step"):
                s = slot(v)
                s["atol"] = v["atol"]
                s["lines"].append((f"{v['impl']} (correct)", "correct", v["per_step"]))
        else:   # the plot names what failed: "torch (78 fail)", "x (3 xfail)", "y (nothing checked)"
            c = counts[v["impl"]]
            what = [f"{c[s]} {s}" for s in (*BAD, "xfail") if c[s]]
            name = f"{v['impl']} ({', '.join(what) or 'nothing checked'})"
            by_line.setdefault((_panel(v), name, "failing", v["model"]), []).append(v)
    for row in run["kill_matrix"]:
        for v in row["verdicts"]:
            if v.get("family") != "parity" or v["check"] == "agreement" or not v["impl"].startswith("mutant:"):
                continue
            by_line.setdefault((_panel(v), row["mutant"], "mutant", v["model"]), []).append(v)
    for (panel, name, kind, model), vs in by_line.items():
        best = _signal_check(vs)
        if best is None:
            continue
        s = slot(best)
        s["atol"] = s["atol"] or next((v["atol"] for v in vs if v["check"] == "param_parity"), best["atol"])
        label = name if best["check"] == "param_parity" else f"{name} [{best['check']}]"
        s["lines"].append((label, kind, best["per_step"]))
    return out
