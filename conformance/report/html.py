"""``python -m conformance report``'s HTML: ``report.html``, one file with no external resources
and no script (what it holds, top to bottom: :func:`write_report`), and beside it the figures of
:mod:`conformance.report.plots`, embedded in the page as ``data:image/png;base64`` URIs:
``sensitivity.png`` (per-step deviations: :func:`conformance.report.runs.sensitivity_series`)
and, with ``--calibration``, ``calibration.png``.

Input: run JSON documents (``python -m conformance run [--mutants] --json``, ``pytest
--conformance-json``: ``verdicts`` with their ``per_step`` deviations, ``kill_matrix``), read
and merged by :mod:`conformance.report.runs`, and calibration JSON (``python -m conformance
calibrate --json``). Matplotlib (Agg backend) is needed: ``pip install -e '.[report]'`` (from a
clone).
"""
from __future__ import annotations

import base64
import html
import math
import os
import re

from conformance.verdict import BAD, Verdict
from conformance.report.coverage import coverage
from conformance.report.kills import KILLED, SKIP, SURVIVED, UNSUPPORTED, KillRow, kill_summary
from conformance.report.plots import plot_calibrations, plot_sensitivity
from conformance.report.runs import (impl_counts, impl_label, is_backend, is_correct, merge_runs,
                                     sensitivity_series, verdict_id)
from conformance.report.text import fmt

STATUS_COLOURS = {"pass": "#c8e6c9", "fail": "#ef9a9a", "vacuous": "#ffcc80",
                  "unsupported": "#e0e0e0", "skip": "#bbdefb", "xfail": "#f8bbd0"}
# Kill results (conformance.report.kills.KILL_RESULTS, of a cell and of a mutant): survived is the red one.
KILL_COLOURS = {KILLED: "#c8e6c9", SURVIVED: "#ef9a9a", UNSUPPORTED: "#e0e0e0", SKIP: "#bbdefb"}


def _title(verdicts: list[dict], impl: str) -> str:
    """``backend gloo`` for the backend beneath the DDPs, the implementation's name otherwise."""
    return f"backend {impl}" if is_backend(verdicts, impl) else impl


def margin_text(v: dict) -> str:
    """The margin (atol / max dev) of a JSON verdict. JSON has no infinity: a margin
    is saved as ``null`` both when the deviation was exactly 0 (margin infinite:
    the check matched exactly) and when nothing was measured (unsupported, skip,
    invariants); ``max_dev`` tells them apart (0 versus ``null``)."""
    m, dev = v.get("margin"), v.get("max_dev")
    if isinstance(m, (int, float)) and not isinstance(m, bool):
        if m == math.inf:
            return "∞ (exact)"
        if m == m and m != -math.inf:
            return f"{m:.3g}×"
    if m is None and isinstance(dev, (int, float)) and dev == 0:
        return "∞ (exact)"
    return "-"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#212121}
h1{font-size:22px} h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #bdbdbd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eeeeee} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td small, th small{color:#555;font-weight:normal}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #bdbdbd}
img{max-width:100%;border:1px solid #e0e0e0}
.meta{color:#616161;font-size:12px}
#overall{font-size:15px;padding:6px 10px;border:1px solid #bdbdbd}
#overall.bad{background:#ef9a9a} #overall.ok{background:#c8e6c9}
details{margin:6px 0} details>summary{cursor:pointer;font-size:15px;padding:3px 0}
pre{font-size:11px;white-space:pre-wrap;max-height:24em;overflow:auto;background:#fafafa;margin:4px 0}
"""
DIAGNOSIS_CHARS = 4000   # of a failure's diagnosis shown in the page (all of it: <json>.failures.txt)


def _e(x) -> str:
    return html.escape(str(x))


def _slug(impl: str) -> str:
    return "impl-" + re.sub(r"[^A-Za-z0-9_.-]", "-", impl)


def _cell(status: str, body: str, title: str = "") -> str:
    colour = STATUS_COLOURS.get(status, "#ffffff")
    return (f'<td class="status-{_e(status)}" style="background:{colour}" '
            f'title="{_e(title)}">{body}</td>')


def _table(attrs: str, head, rows) -> str:
    """A ``<table attrs>`` of the header cells ``head`` and the ``rows`` (each a ``<tr>``, HTML)."""
    return (f"<table {attrs}><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _counts_text(c: dict) -> str:
    return ", ".join(f"{n} {s}" for s, n in c.items() if n) or "no verdicts"


def _measure_text(v: dict) -> str:
    """``dev / bound · margin · step · replica`` of a verdict that measured a deviation, else ""."""
    dev = v.get("max_dev")
    if not isinstance(dev, (int, float)):
        return ""
    out = f"dev {fmt(dev)} / bound {fmt(v.get('atol'))} · margin {margin_text(v)}"
    if v.get("first_bad_step") is not None:
        out += f" · step {v['first_bad_step']}"
    if v.get("replica") is not None:
        out += f" · replica {v['replica']}"
    return out


def _label_status(label: str) -> str:
    """The status colour of an :func:`impl_label`."""
    if is_correct(label):
        return "pass"
    if label.startswith("correct except"):
        return "xfail"
    return "fail" if label.startswith("NOT") else "unsupported"


def summary_table(verdicts: list[dict]) -> str:
    """One row per implementation under test: what its verdicts say and its own counts."""
    if not verdicts:
        return "<p>No verdicts in the input.</p>"
    rows = []
    for impl, c in impl_counts(verdicts).items():
        label = impl_label(c)
        rows.append(f'<tr class="impl-row" data-impl="{_e(impl)}"><td><a href="#{_slug(impl)}">{_e(_title(verdicts, impl))}</a></td>'
                    + _cell(_label_status(label), f"<b>{_e(label)}</b>")
                    + "".join(f'<td class="num count-{s}">{n}</td>' for s, n in c.items()) + "</tr>")
    return _table('id="implementations"', ["implementation", "verdict", *STATUS_COLOURS], rows)


def coverage_section(verdicts: list[dict]) -> str:
    """Per implementation: the tested share and its untested verdicts grouped by cause,
    largest first (:func:`conformance.report.coverage.coverage`)."""
    covs = coverage([Verdict.from_json(v) for v in verdicts])
    if not covs:
        return ""
    return _table('id="coverage"', ["implementation", "tested", "not tested: cause (largest first)"],
                  [f'<tr data-impl="{_e(c.impl)}"><td>{_e(c.impl)}</td><td class="num">{c.tested} of {c.verdicts} '
                   f'({100 * c.share:.1f} %)</td><td>{"<br>".join(_e(x.text()) for x in c.causes) or "-"}</td></tr>'
                   for c in covs])


def failures_section(verdicts: list[dict], kill_rows: list[dict]) -> str:
    """Every fail / vacuous verdict (what makes the run exit 1), implementation by
    implementation, failures before vacuous; then every mutant that survived."""
    order = {impl: i for i, impl in enumerate(impl_counts(verdicts))}
    bad = sorted((v for v in verdicts if v["status"] in BAD),
                 key=lambda v: (order[v["impl"]], BAD.index(v["status"])))  # stable: table order
    krs = [KillRow.from_json(r) for r in kill_rows]
    survived = [k for k, res in kill_summary(krs).items() if res == SURVIVED]
    if not bad and not survived:
        return ('<p id="no-failures">None: no verdict failed or was vacuous'
                + (" and every mutant was killed" if kill_rows else "") + ".</p>")
    out = []
    if bad:
        rows = []
        for v in bad:
            diag = v.get("diagnosis") or ""
            more = ("<details><summary><small>diagnosis" + (" (first part; all of it in &lt;json&gt;.failures.txt)"
                                                            if len(diag) > DIAGNOSIS_CHARS else "")
                    + "</small></summary><pre>" + _e(diag[:DIAGNOSIS_CHARS]) + "</pre></details>") if diag else ""
            rows.append(f'<tr class="failure-row" data-id="{_e(verdict_id(v))}">'
                        + _cell(v["status"], f"<b>{_e(v['status'])}</b>")
                        + f"<td><code>{_e(verdict_id(v))}</code></td><td><small>{_e(_measure_text(v))}</small></td>"
                        + f"<td><small>{_e(v.get('reason') or '')}</small>{more}</td></tr>")
        out.append(f"<p>{len(bad)} failing or vacuous verdict(s).</p>"
                   + _table('id="failures-table"', ["status", "verdict id", "deviation", "reason"], rows))
    if survived:
        rows = [f'<tr class="survivor-row"><td>{_e(m)}</td><td>{_e(rt)}-w{w}</td><td><small>'
                + "<br>".join(_e(r.case + ": " + r.reason()) for r in krs
                              if (r.mutant, r.runtime, r.world_size) == (m, rt, w) and r.result == SURVIVED)
                + "</small></td></tr>" for m, rt, w in survived]
        out.append("<p>Mutants that survived a case that must kill them:</p>"
                   + _table('id="survivors"', ["mutant", "runtime", "cases that did not kill it"], rows))
    return "".join(out)


def impl_section(impl: str, verdicts: list[dict]) -> str:
    """One implementation: a ``<details>`` whose summary gives its verdict and own counts;
    rows (case, check), failing rows first; columns runtime-wW, each with its counts."""
    vs = [v for v in verdicts if v["impl"] == impl]
    c = impl_counts(vs)[impl]
    cols, rows, cells = [], [], {}
    for v in vs:
        col, row = f"{v['runtime']}-w{v['world_size']}", (v["case"], v["check"])
        cols += [col] if col not in cols else []
        rows += [row] if row not in rows else []
        cells[(row, col)] = v
    col_counts = {col: _counts_text(impl_counts([v for v in vs if f"{v['runtime']}-w{v['world_size']}" == col])
                                    [impl]) for col in cols}
    bad_rows = {row for (row, _), v in cells.items() if v["status"] in BAD}
    rows.sort(key=lambda r: r not in bad_rows)   # stable: failing rows first, else table order
    trs = []
    for row in rows:
        tr = (f'<tr class="{"verdict-row bad" if row in bad_rows else "verdict-row"}">'
              f"<td>{_e(row[0])}</td><td>{_e(row[1])}</td>")
        for col in cols:
            v = cells.get((row, col))
            if v is None:
                tr += "<td></td>"
                continue
            body = f"<b>{_e(v['status'])}</b>"
            if _measure_text(v):
                body += f"<br><small>{_e(_measure_text(v))}</small>"
            if v.get("reason"):
                body += f"<br><small>{_e(v['reason'][:120])}</small>"
            tr += _cell(v["status"], body, v.get("reason") or "")
        trs.append(tr + "</tr>")
    head = ["case", "check", *(f"{_e(col)}<br><small>{_e(col_counts[col])}</small>" for col in cols)]
    return (f'<details class="impl" id="{_slug(impl)}" data-impl="{_e(impl)}"><summary><b>{_e(_title(vs, impl))}</b>'
            f' — <span class="impl-label">{_e(impl_label(c))}</span> — '
            f'<span class="impl-counts">{_e(_counts_text(c))}</span></summary>'
            + _table('class="conformance-table"', head, trs) + "</details>")


def kill_table(rows: list[dict]) -> str:
    """Every mutant x every case that must kill it (the CLI's kill matrix, same cells)."""
    if not rows:
        return "<p>No mutants in the input (run with <code>--mutants</code>).</p>"
    krs = [KillRow.from_json(r) for r in rows]
    summ = kill_summary(krs)
    rows = []
    for r in krs:
        res, verdict = r.result, summ[(r.mutant, r.runtime, r.world_size)]
        colour = KILL_COLOURS.get(verdict, KILL_COLOURS[UNSUPPORTED])
        rows.append(f'<tr class="kill-row"><td>{_e(r.mutant)}</td>'
                    f"<td>{_e(r.runtime)}-w{r.world_size}</td><td>{_e(r.case)}</td>"
                    f'<td style="background:{KILL_COLOURS[res]}">{_e(res)}</td>'
                    f'<td style="background:{colour}"><b>{_e(verdict)}</b></td>'
                    f"<td><small>{_e(r.reason()[:160])}</small></td></tr>")
    return _table('id="kill-matrix"', ["mutant", "runtime", "case", "result", "mutant verdict", "reason"], rows)


def calibration_table(cals: list[dict]) -> str:
    rows = []
    for c in cals:
        sig_at = c.get("signal_at") or {}
        ok = c.get("ok")
        notes = ([f"{e['mutant']}: {e['reason']}" for e in c.get("excluded", [])]
                 + [f"{m['mutant']} silent at {len(m['silent_seeds'])}/{len(c['seeds'])} seeds (the mutation did "
                    "not change the run)" for m in c.get("mutants", [])
                    if m.get("silent_seeds") and not m.get("excluded")])
        rows.append("<tr>" + "".join([
            f"<td>{_e(c['runtime'])}-w{c['world_size']}</td>", f"<td>{_e(c['model'])}</td>",
            f"<td>{_e(c['impl'])}</td>", f'<td class="num">{len(c["seeds"])}</td>',
            f'<td class="num">{c["lr"]:g}</td>', f'<td class="num">{fmt(c["atol"])}</td>',
            f'<td class="num">{fmt(c["noise"])}</td>',
            f'<td class="num">{fmt(c["signal"])} <small>{_e(sig_at.get("mutant"))}</small></td>',
            *(f'<td class="num">{fmt(c.get(k), ".3g")}</td>'
              for k in ("atol_over_noise", "signal_over_atol", "signal_over_noise")),
            "<td><small>" + "<br>".join(_e(n) for n in notes) + "</small></td>",
            _cell("pass" if ok else "fail", "<b>OK</b>" if ok else
                  "<b>NOT calibrated</b><br><small>" + _e("; ".join(c.get("problems", []))) + "</small>"),
        ]) + "</tr>")
    return _table('id="calibration-table"', ["runtime", "model", "impl", "seeds", "lr", "atol", "noise",
                                            "signal (weakest mutant)", "atol/noise", "signal/atol", "signal/noise",
                                            "excluded mutants; silent seeds", "verdict"], rows)


def _img(path: str, alt: str, ident: str) -> str:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<img id="{ident}" alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def write_report(run_docs: list[dict], cal_docs: list[dict], out_dir: str, sources=()) -> dict:
    """Write ``report.html`` and the PNGs into ``out_dir``; return their paths.

    The page, top to bottom: the overall result (what the run's exit code says), one
    row per implementation with its own verdict and counts, the failures (every
    fail / vacuous verdict and every surviving mutant), one collapsed section per
    implementation (its table, failing rows first), the kill matrix (collapsed), the
    plots. No script: every part reads without JavaScript."""
    os.makedirs(out_dir, exist_ok=True)
    run = merge_runs(run_docs)
    cals = [c for d in cal_docs for c in d.get("calibrations", [])]
    paths = {"html": os.path.join(out_dir, "report.html"),
             "sensitivity": os.path.join(out_dir, "sensitivity.png")}
    plot_sensitivity(sensitivity_series(run), paths["sensitivity"])
    if cals:
        paths["calibration"] = os.path.join(out_dir, "calibration.png")
        plot_calibrations(cals, paths["calibration"])
    failed, overall = overall_result(run)
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<title>DDP conformance report</title>", f"<style>{CSS}</style></head><body>",
        "<h1>DDP conformance report</h1>",
        f'<p class="meta">{_meta(run, sources)}</p>',
        f'<p id="overall" class="{"bad" if failed else "ok"}"><b>{_e(overall)}</b></p>',
        *_verdict_parts(run), *_kill_parts(run["kill_matrix"]), *_sensitivity_parts(paths["sensitivity"]),
        *(_calibration_parts(cals, paths["calibration"]) if cals else []), "</body></html>",
    ]
    with open(paths["html"], "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return paths


def _kill_counts(kill_rows: list[dict]) -> tuple[dict, int, int]:
    """``(summary, killed, survived)`` of JSON kill-matrix rows (:func:`kill_summary`)."""
    summ = kill_summary([KillRow.from_json(r) for r in kill_rows])
    return summ, sum(v == KILLED for v in summ.values()), sum(v == SURVIVED for v in summ.values())


def overall_result(run: dict) -> tuple[bool, str]:
    """``(failed, text)`` of merged runs (:func:`conformance.report.runs.merge_runs`): what the
    run's exit code says, in one line; the backend's failures only count when judged."""
    summ, killed, survived = _kill_counts(run["kill_matrix"])
    per_impl = impl_counts(run["verdicts"])
    backends = [i for i in per_impl if is_backend(run["verdicts"], i)]
    judged = [i for i in per_impl if i not in backends or run["backend_judged"]]
    n_bad = sum(per_impl[i][s] for i in judged for s in BAD)
    bad_impls = [_title(run["verdicts"], i) for i in judged if any(per_impl[i][s] for s in BAD)]
    n_ddp = len(per_impl) - len(backends)
    overall = (f"FAIL: {n_bad} failing or vacuous verdict(s) in {len(bad_impls)} of {len(judged)} "
               f"implementation(s) ({', '.join(bad_impls) or 'none'})" if n_bad else
               f"PASS: no verdict of the {n_ddp} implementation(s) failed or was vacuous")
    unjudged = [i for i in backends if i not in judged and any(per_impl[i][s] for s in BAD)]
    if unjudged:
        overall += ("; the backend beneath them (" + ", ".join(unjudged) + ") has "
                    + str(sum(per_impl[i][s] for i in unjudged for s in BAD))
                    + " failing verdict(s), reported apart (--fail-on-backend counts them)")
    if run["kill_matrix"]:
        overall += f"; {killed}/{len(summ)} mutants killed" + (f", {survived} {SURVIVED}" if survived else "")
    return bool(n_bad or survived), overall


def _meta(run: dict, sources) -> str:
    """The page's environment and inputs line (escaped HTML)."""
    env = run["environments"][0] if run["environments"] else {}
    meta = _e(", ".join(f"{k} {v}" for k, v in env.items() if v)) + "<br>" + \
        _e("inputs: " + ", ".join(os.path.basename(s) for s in sources))
    if run["duplicates"]:
        meta += f"<br>{run['duplicates']} verdict id(s) appeared in more than one input: the later input's verdict is shown"
    return meta


def _verdict_parts(run: dict) -> list[str]:
    """The implementations, coverage, failures and per-implementation sections."""
    per_impl = impl_counts(run["verdicts"])
    return [
        "<h2>Implementations</h2>",
        "<p>Each implementation under test with its own counts. <i>correct</i> only when none of its "
        "verdicts failed or was vacuous (and one passed). A <i>backend</i> row is the torch.distributed "
        "backend beneath every DDP (the collective family), judged once per world size.</p>",
        summary_table(run["verdicts"]),
        "<h2>Coverage</h2>",
        "<p>The share of each implementation's verdicts whose check ran; the rest (unsupported: "
        "the DDP lacks what the case needs; skip: the case cannot run here) grouped by cause.</p>",
        coverage_section(run["verdicts"]),
        '<h2 id="failures">Failures</h2>',
        failures_section(run["verdicts"], run["kill_matrix"]),
        "<h2>Verdicts per implementation</h2>",
        "<p>Click an implementation to open its table. Rows: case × check, failing rows first; "
        "columns: runtime-world size. A cell gives the status, the largest deviation from the "
        "single-device reference, the bound at that element (atol + rtol × |reference|), the margin "
        "(bound / deviation; ∞ (exact): the deviation "
        "was 0; - : nothing measured), the first bad step and the deviating replica.</p>",
        '<p class="legend">' + "".join(f'<span style="background:{c}">{s}</span>'
                                       for s, c in STATUS_COLOURS.items()) + "</p>",
        *[impl_section(impl, run["verdicts"]) for impl in per_impl],
    ]


def _kill_parts(kill_rows: list[dict]) -> list[str]:
    summ, killed, survived = _kill_counts(kill_rows)
    return [
        "<h2>Mutant kill matrix</h2>",
        "<p>Every catalog mutant through every case that must kill it. killed: a verdict of the case "
        "failed; survived: it ran and nothing failed; unsupported/skip: it could not run (reason).</p>",
        (f'<details id="kill-section"><summary>{len(kill_rows)} cells: {killed}/{len(summ)} '
         f"mutants killed{f', {survived} {SURVIVED}' if survived else ''}</summary>"
         + kill_table(kill_rows) + "</details>") if kill_rows else kill_table([]),
    ]


def _sensitivity_parts(png: str) -> list[str]:
    return [
        "<h2>Sensitivity</h2>",
        "<p>Per-step deviation on a log axis, one panel per model and runtime-world size (each "
        "axis spans its own values): the correct implementations (black; <code>param_parity</code>), "
        "implementations under test that failed (thick dash-dot, labelled with their failures) and "
        "every mutant (<code>param_parity</code> when it fails, else the failing check with the "
        "largest deviation, named in brackets). Red dashed: the verdicts' bound, the JSON "
        "<code>atol</code> field, which is atol + rtol × |reference| at the worst element (the "
        "tolerance table's atol when its rtol is 0: then every point above it fails; with rtol &gt; 0 "
        "other elements have other bounds). "
        "A deviation of 0 is drawn at the panel's bottom.</p>",
        _img(png, "per-step deviation of correct runs and mutants", "sensitivity-plot"),
    ]


def _calibration_parts(cals: list[dict], png: str) -> list[str]:
    return ["<h2>Calibration</h2>",
            "<p>From <code>python -m conformance calibrate</code>: noise = largest deviation "
            "of a correct run over the seeds; signal = over visible mutants, the smallest of "
            "each mutant's weakest-seed largest deviation among the checks that kill it "
            "(definitions in <code>conformance/cli/calibrate.py</code>). Well placed: atol ≥ 10 × "
            "noise, atol ≤ signal / 10, signal / noise ≥ 100.</p>",
            calibration_table(cals),
            _img(png, "calibration: correct runs over seeds and mutants", "calibration-plot")]
