"""The figures of the HTML report (:mod:`conformance.report.html`), drawn with matplotlib (Agg
backend, imported where drawn): the sensitivity figure, small multiples of per-step deviations
(:func:`sensitivity_figure`, from :func:`conformance.report.html.sensitivity_series`), and the
calibration figure (:func:`plot_calibrations`, from ``python -m conformance calibrate`` JSON)."""
from __future__ import annotations

import math

ZERO_FLOOR = 1e-10   # a deviation of exactly 0 is drawn here on the log axis


def _clip(values):
    return [ZERO_FLOOR if (x is None or x <= 0) else (1e3 if not math.isfinite(x) else x) for x in values]


def _mutant_colours(names):
    import matplotlib
    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(sorted(names))}


# The sensitivity figure: small multiples, wrapped so the PNG stays within a laptop screen.
SENS_DPI = 110
SENS_MAX_PX = 1400
SENS_PANEL_IN = (3.0, 2.5)  # one panel, inches (4 a row fit 1400 px)
SENS_MARGIN_IN = 0.4
CORRECT_STYLES = ["-", "--", ":", "-."]  # one per correct implementation on a panel


def _panel_values(steps: list, lo: float, hi: float) -> list:
    """A line's points on a panel whose data span ``lo..hi``: 0 (and None) at ``lo / 10``,
    NaN/Inf at ``hi * 10``, so both stay inside the panel's limits and read as off-scale."""
    return [lo / 10 if (x is None or x == 0) else hi * 10 if not math.isfinite(x) or x < 0 else x
            for x in steps]


def sensitivity_figure(series: dict):
    """The sensitivity figure (module docstring) as a matplotlib figure: one panel per
    (runtime-wW, model) with data, wrapped at :data:`SENS_MAX_PX`; each panel's log axis spans
    its own points and its bound, so a float64 panel (deviations ~1e-16) keeps both in view."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [(panel, model) for panel in sorted(series) for model in series[panel]
             if series[panel][model]["lines"]]
    mutant_names = sorted({lab.split(" [")[0] for p in series.values() for s in p.values()
                           for lab, kind, _ in s["lines"] if kind != "correct"})
    colours = _mutant_colours(mutant_names)
    pw, ph = SENS_PANEL_IN
    cols = max(1, min(len(cells), int((SENS_MAX_PX / SENS_DPI - SENS_MARGIN_IN) // pw)))
    rows = max(1, -(-len(cells) // cols))
    legend_rows = -(-(len(mutant_names) + 4) // max(1, cols * 2))  # legend below, 2 entries a column
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(pw * cols + SENS_MARGIN_IN, ph * rows + 0.6
                                                                  + 0.22 * legend_rows))
    handles = {}
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    if not cells:
        axes[0][0].set_visible(True)
        axes[0][0].text(0.5, 0.5, "no data", ha="center", va="center", transform=axes[0][0].transAxes)
    for n, (panel, model) in enumerate(cells):
        ax = axes[n // cols][n % cols]
        _sensitivity_panel(ax, series[panel][model], f"{model} · {panel}", colours, handles)
        if n % cols == 0:
            ax.set_ylabel("max |replica − ref|", fontsize=7)
        if n // cols == rows - 1 or n + cols >= len(cells):
            ax.set_xlabel("step", fontsize=7)
    fig.suptitle("Sensitivity: per-step deviation from the single-device reference", fontsize=10)
    legend_h = (0.22 * legend_rows + 0.1) / fig.get_figheight()
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", fontsize=7,
                   frameon=False, ncol=max(1, min(len(handles), cols * 2)))
    fig.tight_layout(rect=(0, legend_h, 1, 1 - 0.35 / fig.get_figheight()))
    return fig


def _sensitivity_panel(ax, s: dict, title: str, colours: dict, handles: dict) -> None:
    """One panel of the sensitivity figure: the lines of ``s`` (``{"atol", "lines"}``) on a log
    axis spanning them and their bound; ``handles`` collects the legend's entries."""
    from matplotlib.ticker import MaxNLocator

    ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)
    finite = [x for _, _, steps in s["lines"] for x in steps if x is not None and math.isfinite(x) and x > 0]
    bound = s["atol"] if s["atol"] and math.isfinite(s["atol"]) and s["atol"] > 0 else None
    span = finite + ([bound] if bound else [])
    lo, hi = (min(span), max(span)) if span else (1e-10, 1.0)
    k = 0
    for label, kind, steps in sorted(s["lines"], key=lambda x: (x[1] != "correct", x[0])):
        xs = list(range(1, len(steps) + 1))
        ys = _panel_values(steps, lo, hi)
        if kind == "correct":
            h, = ax.plot(xs, ys, color="black", lw=2.0, ls=CORRECT_STYLES[k % len(CORRECT_STYLES)],
                         label=label, zorder=3)
            k += 1
            handles.setdefault(label, h)
        else:
            base = label.split(" [")[0]
            failing = kind == "failing"  # an implementation under test that failed
            h, = ax.plot(xs, ys, color=colours[base], lw=2.0 if failing else 1.1,
                         ls="-." if failing else "-", marker="s" if failing else "o",
                         ms=3 if failing else 2.2, label=base, alpha=0.9)
            handles.setdefault(base, h)
            if label != base:  # name the check on the panel
                ax.annotate(label[len(base) + 1:], (xs[-1], ys[-1]), fontsize=6, color=colours[base],
                            xytext=(2, 0), textcoords="offset points")
    if bound:
        h = ax.axhline(bound, color="red", lw=1.4, ls="--", zorder=4)
        handles.setdefault("bound (verdict's atol: atol + rtol·|ref| at the worst element)", h)
        ax.annotate(f"bound {bound:.2g}", (0.01, bound), xycoords=("axes fraction", "data"), fontsize=6,
                    color="red", xytext=(0, 2), textcoords="offset points")
    zero = any(x == 0 or x is None for _, _, steps in s["lines"] for x in steps)
    off = any(x is not None and not math.isfinite(x) for _, _, steps in s["lines"] for x in steps)
    # room below and above: the points, the bound, and the 0 / off-scale rows (x10)
    ax.set_ylim(lo / 30, hi * (300 if off else 30))
    ax.set_title(title + ("  (0 at bottom)" if zero else ""), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_sensitivity(series: dict, path: str) -> None:
    import matplotlib.pyplot as plt
    fig = sensitivity_figure(series)
    fig.savefig(path, dpi=SENS_DPI)
    plt.close(fig)


def _scaled(check: dict, atol: float) -> list:
    """A calibration check's per-step deviations on the scale of ``atol`` (calibrate's scale)."""
    k = atol / check["atol"] if check.get("atol") else 1.0
    return [(x if x is not None else math.inf) * k for x in check.get("per_step", [])]


def _per_step_max(checks: dict, atol: float) -> list:
    """Per-step max over checks of the deviation scaled to ``atol``."""
    rows = [_scaled(c, atol) for c in checks.values() if c.get("per_step")]
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
            ys = _scaled(run["checks"].get(m["signal_at"]["check"]) or {}, atol)
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
