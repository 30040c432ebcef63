"""``python -m conformance report``: a self-contained HTML report of a run.

Input: one or more run JSON files (what ``python -m conformance run [--mutants]
--json`` or ``pytest --conformance-json`` write: ``verdicts`` and
``kill_matrix``, every verdict with its ``per_step`` deviations), and optionally
calibration JSON files (``python -m conformance calibrate --json``).

Output in ``--out DIR``:

* ``report.html`` - one file, no external resources: the conformance table
  (check x model rows, implementation x runtime columns, statuses colour-coded),
  the mutant kill matrix, the calibration table, and the plots embedded as
  ``data:image/png;base64`` URIs;
* ``sensitivity.png`` - per-step deviation from the single-device reference on a
  log axis, one row of panels per runtime (and world size), one panel per model:
  the correct implementations' ``param_parity`` deviation, and for every mutant
  its ``param_parity`` deviation when that check kills it, else the failing check
  with the largest deviation (named on the panel), with the table's atol line;
* ``calibration.png`` (with ``--calibration``) - one panel per calibration: the
  correct runs over every seed, each mutant's weakest seed, atol, noise and
  signal (definitions in :mod:`conformance.cli.calibrate`).

Matplotlib (Agg backend) is needed: ``pip install 'ddp-conformance[report]'``.
Exit 0 when written, 2 on bad input (one ``error:`` line).
"""
from __future__ import annotations

import base64
import html
import json
import math
import os

ZERO_FLOOR = 1e-10   # a deviation of exactly 0 is drawn here on the log axis
STATUS_COLOURS = {"pass": "#c8e6c9", "fail": "#ef9a9a", "vacuous": "#ffcc80",
                  "unsupported": "#e0e0e0", "skip": "#bbdefb", "xfail": "#f8bbd0"}
# Kill-matrix results (conformance.report.text.KillRow.result): survived is the red one.
KILL_COLOURS = {"KILL": "#c8e6c9", "survived": "#ef9a9a", "unsupported": "#e0e0e0", "skip": "#bbdefb"}


def _load(path: str) -> dict:
    from conformance.errors import UsageError
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


def _panel(v: dict) -> str:
    return f"{v['runtime']}-w{v['world_size']}"


def _fmt(x, spec=".2e"):
    from conformance.report.text import fmt  # the text table's number format
    return fmt(x, spec)


def _is_mutant(impl: str) -> bool:
    return impl.startswith("mutant:")


# --------------------------------------------------------------------- data
def merge_runs(docs: list[dict]) -> dict:
    """Verdicts and kill-matrix rows of several run JSON files."""
    verdicts, kills, envs = [], [], []
    for d in docs:
        verdicts += d.get("verdicts", [])
        kills += d.get("kill_matrix", [])
        if d.get("environment"):
            envs.append(d["environment"])
    return {"verdicts": verdicts, "kill_matrix": kills, "environments": envs}


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
    """``{panel: {model: {"atol": float, "lines": [(label, kind, per_step)]}}}``."""
    out: dict = {}

    def slot(v):
        return out.setdefault(_panel(v), {}).setdefault(v["model"], {"atol": None, "lines": []})

    by_mutant: dict = {}
    for v in run["verdicts"]:
        if v.get("family") != "parity" or v["check"] == "agreement":  # parity trajectories only
            continue
        if _is_mutant(v["impl"]):
            by_mutant.setdefault((_panel(v), v["impl"][7:], v["model"]), []).append(v)
        elif v["check"] == "param_parity" and v.get("per_step"):
            s = slot(v)
            s["atol"] = v["atol"]
            s["lines"].append((f"{v['impl']} (correct)", "correct", v["per_step"]))
    for row in run["kill_matrix"]:
        for v in row["verdicts"]:
            if v.get("family") != "parity" or v["check"] == "agreement" or not _is_mutant(v["impl"]):
                continue
            by_mutant.setdefault((_panel(v), row["mutant"], v["model"]), []).append(v)
    for (panel, mutant, model), vs in by_mutant.items():
        best = _signal_check(vs)
        if best is None:
            continue
        s = slot(best)
        s["atol"] = s["atol"] or next((v["atol"] for v in vs if v["check"] == "param_parity"), best["atol"])
        label = mutant if best["check"] == "param_parity" else f"{mutant} [{best['check']}]"
        s["lines"].append((label, "mutant", best["per_step"]))
    return out


# --------------------------------------------------------------------- plots
def _clip(values):
    return [ZERO_FLOOR if (x is None or x <= 0) else (1e3 if not math.isfinite(x) else x) for x in values]


def _mutant_colours(names):
    import matplotlib
    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(sorted(names))}


def plot_sensitivity(series: dict, path: str) -> None:
    """Write the sensitivity figure (see the module docstring) to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = sorted(series)
    models = []
    for p in panels:
        models += [m for m in series[p] if m not in models]
    if not panels:
        panels, models = ["(no data)"], ["(no data)"]
    mutant_names = sorted({lab.split(" [")[0] for p in series.values() for s in p.values()
                           for lab, kind, _ in s["lines"] if kind == "mutant"})
    colours = _mutant_colours(mutant_names)
    correct_styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(len(panels), len(models), squeeze=False,
                             figsize=(4.6 * len(models) + 2.8, 3.6 * len(panels) + 0.6))
    handles = {}
    for i, panel in enumerate(panels):
        for j, model in enumerate(models):
            ax = axes[i][j]
            s = series.get(panel, {}).get(model)
            ax.set_title(f"{panel}  ·  {model}", fontsize=10)
            ax.set_yscale("log")
            ax.grid(True, which="major", alpha=0.3)
            if i == len(panels) - 1:
                ax.set_xlabel("step")
            if j == 0:
                ax.set_ylabel("max |replica − reference|")
            if not s:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
                continue
            k = 0
            for label, kind, steps in sorted(s["lines"], key=lambda x: (x[1] != "correct", x[0])):
                xs = list(range(1, len(steps) + 1))
                if kind == "correct":
                    h, = ax.plot(xs, _clip(steps), color="black", lw=2.2,
                                 ls=correct_styles[k % len(correct_styles)], label=label, zorder=3)
                    k += 1
                    handles.setdefault(label, h)
                else:
                    base = label.split(" [")[0]
                    h, = ax.plot(xs, _clip(steps), color=colours[base], lw=1.2, marker="o", ms=2.5,
                                 label=base, alpha=0.9)
                    handles.setdefault(base, h)
                    if label != base:  # name the check on the panel
                        ax.annotate(label[len(base) + 1:], (xs[-1], _clip(steps)[-1]), fontsize=6,
                                    color=colours[base], xytext=(2, 0), textcoords="offset points")
            if s["atol"]:
                h = ax.axhline(s["atol"], color="red", lw=1.5, ls="--", label="atol", zorder=4)
                handles.setdefault("atol (tolerance table)", h)
            ax.set_ylim(bottom=ZERO_FLOOR / 2)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle("Sensitivity: per-step deviation from the single-device reference "
                 f"(0 drawn at {ZERO_FLOOR:g})", fontsize=11)
    fig.legend(list(handles.values()), list(handles.keys()), loc="center right", fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / fig.get_figwidth(), 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _per_step_max(checks: dict, atol: float) -> list:
    """Per-step max over checks of the deviation scaled to ``atol`` (calibrate's scale)."""
    rows = []
    for c in checks.values():
        if c.get("per_step"):
            k = atol / c["atol"] if c.get("atol") else 1.0
            rows.append([(x if x is not None else math.inf) * k for x in c["per_step"]])
    return [max(col) for col in zip(*rows)] if rows else []


def plot_calibrations(cals: list[dict], path: str) -> None:
    """Write the calibration figure: one panel per calibration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    n = len(cals)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    names = sorted({m["mutant"] for c in cals for m in c["mutants"]})
    colours = _mutant_colours(names)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.8 * cols + 2.8, 3.8 * rows + 0.6))
    handles = {}
    for idx, cal in enumerate(cals):
        ax = axes[idx // cols][idx % cols]
        atol = cal["atol"]
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{cal['runtime']}-w{cal['world_size']} · {cal['model']} · {cal['impl']} "
                     f"({len(cal['seeds'])} seeds)", fontsize=9)
        ax.set_xlabel("step")
        for run in cal["correct"]:
            ys = _per_step_max(run["checks"], atol)
            h, = ax.plot(range(1, len(ys) + 1), _clip(ys), color="0.35", lw=1, alpha=0.7)
            handles.setdefault("correct implementation, every seed", h)
        for m in cal["mutants"]:
            if m.get("excluded") or not m.get("signal_at"):
                continue
            run = next(r for r in m["runs"] if r["seed"] == m["signal_at"]["seed"])
            chk = run["checks"].get(m["signal_at"]["check"]) or {}
            k = atol / chk["atol"] if chk.get("atol") else 1.0
            ys = [(x if x is not None else math.inf) * k for x in chk.get("per_step", [])]
            h, = ax.plot(range(1, len(ys) + 1), _clip(ys), color=colours[m["mutant"]], lw=1.1,
                         marker="o", ms=2.5)
            handles.setdefault(m["mutant"], h)
        h = ax.axhline(atol, color="red", ls="--", lw=1.5)
        handles.setdefault("atol", h)
        if cal.get("noise"):
            h = ax.axhline(cal["noise"], color="0.35", ls=":", lw=1.2)
            handles.setdefault("noise floor", h)
        if cal.get("signal"):
            h = ax.axhline(cal["signal"], color="purple", ls=":", lw=1.2)
            handles.setdefault("signal (weakest mutant)", h)
        ax.set_ylim(bottom=ZERO_FLOOR / 2)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if idx % cols == 0:
            ax.set_ylabel("deviation (scale of atol)")
    for idx in range(n, rows * cols):
        axes[idx // cols][idx % cols].axis("off")
    fig.suptitle("Calibration: correct runs over seeds vs each mutant's weakest seed "
                 f"(0 drawn at {ZERO_FLOOR:g})", fontsize=11)
    fig.legend(list(handles.values()), list(handles.keys()), loc="center right", fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / fig.get_figwidth(), 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------- HTML
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#212121}
h1{font-size:22px} h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #bdbdbd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eeeeee} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td small{color:#555}
.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border:1px solid #bdbdbd}
img{max-width:100%;border:1px solid #e0e0e0}
.meta{color:#616161;font-size:12px}
"""


def _cell(status: str, body: str, title: str = "") -> str:
    colour = STATUS_COLOURS.get(status, "#ffffff")
    return (f'<td class="status-{html.escape(status)}" style="background:{colour}" '
            f'title="{html.escape(title)}">{body}</td>')


def conformance_table(verdicts: list[dict]) -> str:
    """Rows (case, check), columns (implementation, runtime-wW) of the non-mutant verdicts;
    cells from :func:`conformance.report.text.verdict_cells` (the text table's cells)."""
    from conformance.report.text import verdict_cells
    from conformance.verdict import Verdict
    vs = [Verdict.from_json(v) for v in verdicts if not _is_mutant(v["impl"])]
    cols, rows, cells = [], [], {}
    for v in vs:
        col, row = (v.impl, f"{v.runtime}-w{v.world_size}"), (v.case, v.check)
        cols += [col] if col not in cols else []
        rows += [row] if row not in rows else []
        cells[(row, col)] = v
    if not vs:
        return "<p>No verdicts of correct implementations in the input.</p>"
    out = ['<table id="conformance-table"><thead><tr><th>case</th><th>check</th>']
    out += [f"<th>{html.escape(i)}<br><small>{html.escape(r)}</small></th>" for i, r in cols]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append(f'<tr class="verdict-row"><td>{html.escape(row[0])}</td><td>{html.escape(row[1])}</td>')
        for col in cols:
            v = cells.get((row, col))
            if v is None:
                out.append("<td></td>")
                continue
            c = verdict_cells(v)
            body = f"<b>{html.escape(c['status'])}</b>"
            if c["max dev"] != "-":
                body += (f"<br><small>dev {c['max dev']} / atol {c['atol']} · margin {c['margin']}x"
                         + (f" · step {c['first bad step']}" if c["first bad step"] != "-" else "")
                         + (f" · replica {c['replica']}" if c["replica"] != "-" else "") + "</small>")
            if c["reason"]:
                body += f"<br><small>{html.escape(c['reason'][:120])}</small>"
            out.append(_cell(v.status, body, c["reason"]))
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def kill_table(rows: list[dict]) -> str:
    """Every mutant x every case that must kill it (the CLI's kill matrix, same cells)."""
    if not rows:
        return "<p>No mutants in the input (run with <code>--mutants</code>).</p>"
    from conformance.report.text import KillRow, kill_summary
    krs = [KillRow.from_json(r) for r in rows]
    summ = kill_summary(krs)
    out = ['<table id="kill-matrix"><thead><tr><th>mutant</th><th>runtime</th><th>case</th>'
           '<th>result</th><th>mutant verdict</th><th>reason</th></tr></thead><tbody>']
    for r in krs:
        res, verdict = r.result, summ[(r.mutant, r.runtime, r.world_size)]
        colour = {"killed": "#c8e6c9", "SURVIVED": "#ef9a9a"}.get(verdict, "#e0e0e0")
        out.append(f'<tr class="kill-row"><td>{html.escape(r.mutant)}</td>'
                   f"<td>{html.escape(r.runtime)}-w{r.world_size}</td><td>{html.escape(r.case)}</td>"
                   f'<td style="background:{KILL_COLOURS[res]}">{html.escape(res)}</td>'
                   f'<td style="background:{colour}"><b>{html.escape(verdict)}</b></td>'
                   f"<td><small>{html.escape(r.reason()[:160])}</small></td></tr>")
    out.append("</tbody></table>")
    return "".join(out)


def calibration_table(cals: list[dict]) -> str:
    head = ["runtime", "model", "impl", "seeds", "lr", "atol", "noise", "signal (weakest mutant)",
            "atol/noise", "signal/atol", "signal/noise", "excluded mutants; silent seeds", "verdict"]
    out = ['<table id="calibration-table"><thead><tr>'] + [f"<th>{h}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for c in cals:
        sig_at = c.get("signal_at") or {}
        ok = c.get("ok")
        out.append("<tr>" + "".join([
            f"<td>{html.escape(c['runtime'])}-w{c['world_size']}</td>", f"<td>{html.escape(c['model'])}</td>",
            f"<td>{html.escape(c['impl'])}</td>", f'<td class="num">{len(c["seeds"])}</td>',
            f'<td class="num">{c["lr"]:g}</td>', f'<td class="num">{_fmt(c["atol"])}</td>',
            f'<td class="num">{_fmt(c["noise"])}</td>',
            f'<td class="num">{_fmt(c["signal"])} <small>{html.escape(str(sig_at.get("mutant")))}</small></td>',
            f'<td class="num">{_fmt(c.get("atol_over_noise"), ".3g")}</td>',
            f'<td class="num">{_fmt(c.get("signal_over_atol"), ".3g")}</td>',
            f'<td class="num">{_fmt(c.get("signal_over_noise"), ".3g")}</td>',
            "<td><small>" + "<br>".join([html.escape(f"{e['mutant']}: {e['reason']}")
                                         for e in c.get("excluded", [])]
                                        + [html.escape(f"{m['mutant']} silent at {len(m['silent_seeds'])}/"
                                                       f"{len(c['seeds'])} seeds (the mutation did not "
                                                       "change the run)")
                                           for m in c.get("mutants", [])
                                           if m.get("silent_seeds") and not m.get("excluded")])
            + "</small></td>",
            _cell("pass" if ok else "fail", "<b>OK</b>" if ok else
                  "<b>NOT calibrated</b><br><small>" + html.escape("; ".join(c.get("problems", []))) + "</small>"),
        ]) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _img(path: str, alt: str, ident: str) -> str:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<img id="{ident}" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_report(run_docs: list[dict], cal_docs: list[dict], out_dir: str, sources=()) -> dict:
    """Write ``report.html`` and the PNGs into ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    run = merge_runs(run_docs)
    cals = [c for d in cal_docs for c in d.get("calibrations", [])]
    paths = {"html": os.path.join(out_dir, "report.html"),
             "sensitivity": os.path.join(out_dir, "sensitivity.png")}
    plot_sensitivity(sensitivity_series(run), paths["sensitivity"])
    if cals:
        paths["calibration"] = os.path.join(out_dir, "calibration.png")
        plot_calibrations(cals, paths["calibration"])
    counts = {s: sum(v["status"] == s for v in run["verdicts"] if not _is_mutant(v["impl"]))
              for s in STATUS_COLOURS}
    from conformance.report.text import KillRow, kill_summary
    summ = kill_summary([KillRow.from_json(r) for r in run["kill_matrix"]])
    killed = sum(v == "killed" for v in summ.values())
    env = run["environments"][0] if run["environments"] else {}
    parts = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<title>DDP conformance report</title>", f"<style>{CSS}</style></head><body>",
        "<h1>DDP conformance report</h1>",
        '<p class="meta">' + html.escape(", ".join(f"{k} {v}" for k, v in env.items() if v)) + "<br>"
        + html.escape("inputs: " + ", ".join(os.path.basename(s) for s in sources)) + "</p>",
        '<p id="summary">' + html.escape(", ".join(f"{n} {s}" for s, n in counts.items())
                                         + (f"; {killed}/{len(summ)} mutants killed"
                                            if run["kill_matrix"] else "")) + "</p>",
        '<p class="legend">' + "".join(f'<span style="background:{c}">{s}</span>'
                                       for s, c in STATUS_COLOURS.items()) + "</p>",
        "<h2>Conformance table</h2>",
        "<p>Rows: case × check; columns: implementation × runtime-world size. A cell gives the "
        "status, the largest deviation from the single-device reference, the atol, the margin "
        "(atol / deviation), the first bad step and the deviating replica.</p>",
        conformance_table(run["verdicts"]),
        "<h2>Mutant kill matrix</h2>",
        "<p>Every catalog mutant through every case that must kill it. KILL: a verdict of the case "
        "failed; survived: it ran and nothing failed; unsupported/skip: it could not run (reason).</p>",
        kill_table(run["kill_matrix"]),
        "<h2>Sensitivity</h2>",
        "<p>Per-step deviation on a log axis: the correct implementations (black; "
        "<code>param_parity</code>) and every mutant (<code>param_parity</code> when it kills the "
        "mutant, else the failing check with the largest deviation, named in brackets), with the tolerance table's "
        "atol (red dashed). Everything above the line fails.</p>",
        _img(paths["sensitivity"], "per-step deviation of correct runs and mutants", "sensitivity-plot"),
    ]
    if cals:
        parts += ["<h2>Calibration</h2>",
                  "<p>From <code>python -m conformance calibrate</code>: noise = largest deviation "
                  "of a correct run over the seeds; signal = over visible mutants, the smallest of "
                  "each mutant's weakest-seed largest deviation among the checks that kill it "
                  "(definitions in <code>conformance/cli/calibrate.py</code>). Well placed: atol ≥ 10 × "
                  "noise, atol ≤ signal / 10, signal / noise ≥ 100.</p>",
                  calibration_table(cals),
                  _img(paths["calibration"], "calibration: correct runs over seeds and mutants",
                       "calibration-plot")]
    parts.append("</body></html>")
    with open(paths["html"], "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return paths
