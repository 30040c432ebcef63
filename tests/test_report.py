"""``python -m conformance report``: the HTML renders in a real headless Chromium
(table rows and the embedded PNG with a non-zero natural size), and says what the
verdicts say: margins of exact matches read infinite, a DDP with failures is never
labelled correct, each DDP has its own counts, failures come first."""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from conformance.report.kills import KillRow
from conformance.report.text import write_json
from conformance.verdict import Verdict

pytestmark = pytest.mark.cpu

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Written into the page before --dump-dom: every image's natural size once loaded, where the
# failures section and the first implementation section are, and the height of that closed
# <details> against its summary line (the per-implementation tables stay folded away).
PROBE = """<script>
window.addEventListener("load", function () {
  var p = document.createElement("pre"); p.id = "probe";
  var impl = document.querySelector("details.impl");
  p.textContent = JSON.stringify({images: Array.prototype.map.call(document.images, function (i) {
    return {id: i.id, w: i.naturalWidth, h: i.naturalHeight, complete: i.complete,
            data: i.src.indexOf("data:image/png;base64,") === 0};
  }), failures_top: document.getElementById("failures").getBoundingClientRect().top,
      impl_top: impl.getBoundingClientRect().top, impl_height: impl.getBoundingClientRect().height,
      impl_summary_height: impl.querySelector("summary").getBoundingClientRect().height,
      page_height: document.documentElement.scrollHeight});
  document.body.appendChild(p);
});
</script>"""


def chromium():
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium is not installed (none of " + ", ".join(CHROMIUM_NAMES) + " on PATH); "
                "the HTML report is rendered in a real headless browser: apt-get install -y chromium")


def _verdict(check, impl, model, dev, atol=1e-5, steps=5, status=None, w=2, runtime="cpu"):
    per_step = [dev * (k + 1) / steps for k in range(steps)]
    st = status or ("fail" if dev > atol else "pass")
    return Verdict(f"parity.{model}", check, impl, runtime, model, w, st, max_dev=dev, atol=atol,
                   margin=atol / dev if dev else math.inf, movement=0.5, per_step=per_step,
                   reason="synthetic" if st != "pass" else "", family="parity")


@pytest.fixture
def run_json(tmp_path):
    """A run JSON as ``run --mutants --json`` writes it (synthetic numbers)."""
    verdicts = [_verdict(c, i, m, 2e-8) for i in ("torch", "ref") for m in ("linear", "batchnorm")
                for c in ("param_parity", "loss_parity")]
    verdicts.append(_verdict("buffer_parity", "ref", "batchnorm", 0.0))
    verdicts.append(Verdict("parity.batchnorm", "buffer_parity", "torch", "cpu", "batchnorm", 2, "unsupported",
                            reason="no buffers", family="parity"))
    kills = [KillRow("cpu", 2, "no_grad_sync", f"parity.{m}",
                     [_verdict("param_parity", "mutant:no_grad_sync", m, 3e-2)]) for m in ("linear", "batchnorm")]
    kills.append(KillRow("cpu", 2, "buffers_not_broadcast", "parity.batchnorm",
                         [_verdict("param_parity", "mutant:buffers_not_broadcast", "batchnorm", 2e-8),
                          _verdict("buffer_parity", "mutant:buffers_not_broadcast", "batchnorm", 0.5)]))
    kills.append(KillRow("cpu", 2, "join_dropped", "feature.join",
                         [Verdict("feature.join", "params", "mutant:join_dropped", "cpu", "linear", 2,
                                  "unsupported", reason="synthetic: no join")]))
    path = tmp_path / "run.json"
    write_json(str(path), verdicts, kills)
    return path


def test_report_renders_in_headless_chromium(run_json, tmp_path):
    browser = chromium()
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "conformance", "report", "--json", str(run_json),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (out / "report.html").read_text()
    png = (out / "sensitivity.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # self-contained: no external resource (links only within the page); the PNG written next
    # to it is the one embedded
    assert not re.search(r'(src|href)="(?!data:|#)', page)
    import base64
    assert base64.b64encode(png).decode() in page

    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    profile = tmp_path / "chromium-profile"
    shot = tmp_path / "shot.png"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run",
              f"--user-data-dir={profile}", "--virtual-time-budget=5000"]
    dom = subprocess.run(common + ["--dump-dom", probed.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    # one table per implementation: one row per (case, check), statuses as coloured cells
    rows = re.findall(r'<tr class="verdict-row[^"]*">(.*?)</tr>', html, re.S)
    assert len(rows) == 2 * 5, html[:3000]
    assert any("param_parity" in row and "parity.linear" in row for row in rows)
    assert 'class="status-pass"' in html and 'class="status-unsupported"' in html
    kill_rows = re.findall(r'<tr class="kill-row">(.*?)</tr>', html, re.S)
    assert len(kill_rows) == 4
    # an unsupported mutant is grey "unsupported", not a red NO
    join = next(r for r in kill_rows if "join_dropped" in r)
    assert "unsupported" in join and "#ef9a9a" not in join
    probe = re.search(r'<pre id="probe">(.*?)</pre>', html, re.S)
    assert probe, "the probe script did not run (no <pre id=probe> in the dumped DOM)"
    probed_layout = json.loads(probe.group(1).replace("&quot;", '"'))
    images = probed_layout["images"]
    sens = [i for i in images if i["id"] == "sensitivity-plot"]
    assert sens and sens[0]["data"] and sens[0]["complete"], images
    assert sens[0]["w"] > 400 and sens[0]["h"] > 200, images
    # laid out: failures above the per-implementation sections, which are folded
    assert probed_layout["failures_top"] < probed_layout["impl_top"], probed_layout
    assert probed_layout["impl_height"] < probed_layout["impl_summary_height"] + 5, probed_layout
    print("rendered page height:", probed_layout["page_height"], "px")

    snap = subprocess.run(common + ["--window-size=1400,2000", f"--screenshot={shot}", probed.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert snap.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000, snap.stderr[-2000:]
    if os.environ.get("CONFORMANCE_KEEP_SCREENSHOT"):  # to look at it
        shutil.copy(shot, os.environ["CONFORMANCE_KEEP_SCREENSHOT"])


def test_report_bad_input_exit_2(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"calibrations": []}))
    for args, needle in [(["--json", str(tmp_path / "missing.json")], "cannot read"),
                         (["--json", str(cal)], "not a run JSON")]:
        r = subprocess.run([sys.executable, "-m", "conformance", "report", *args, "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


# --- what the page says (no browser needed) -------------------------------------------

def htmlreport():
    """The report module."""
    import conformance.report.html
    return conformance.report.html


def _ids(page, cls):
    return re.findall(rf'<tr class="{cls}" data-id="([^"]+)"', page)


@pytest.fixture
def two_ddps(tmp_path):
    """Two DDPs in one run JSON: ``ref`` (passes; one exact match, one check that measures
    nothing, one unsupported) and ``broken`` (one fail, one vacuous)."""
    ref = [_verdict("param_parity", "ref", "linear", 2e-8),
           _verdict("loss_parity", "ref", "linear", 0.0),       # margin inf -> JSON null
           Verdict("invariant.ranks", "ranks", "ref", "cpu", "-", 2, "pass", reason="2 replica(s) on 1 host(s)",
                   family="invariant"),                          # nothing measured: null
           Verdict("parity.batchnorm", "buffer_parity", "ref", "cpu", "batchnorm", 2, "unsupported",
                   reason="no buffers", family="parity")]
    broken = [_verdict("param_parity", "broken", "linear", 3e-2),
              _verdict("loss_parity", "broken", "linear", 2e-8, status="vacuous"),
              _verdict("param_parity", "broken", "mlp", 2e-8),
              _verdict("loss_parity", "broken", "mlp", 4e-1)]
    path = tmp_path / "run.json"
    write_json(str(path), broken[:2] + ref + broken[2:])  # interleaved: grouping is the report's job
    doc = json.loads(path.read_text())
    by_id = {v["id"]: v for v in doc["verdicts"]}
    assert by_id["parity.linear:loss_parity[ref-cpu-w2]"]["margin"] is None  # how JSON keeps inf
    assert by_id["invariant.ranks:ranks[ref-cpu-w2]"]["margin"] is None
    paths = htmlreport().write_report([doc], [], str(tmp_path / "out"), sources=[str(path)])
    return doc, (tmp_path / "out" / "report.html").read_text(), paths


def test_margin_of_json_null(two_ddps):
    margin_text = htmlreport().margin_text
    assert margin_text({"margin": None, "max_dev": 0.0, "atol": 1e-5}) == "∞ (exact)"
    assert margin_text({"margin": None, "max_dev": None, "atol": None}) == "-"
    assert margin_text({"margin": float("inf"), "max_dev": 0.0}) == "∞ (exact)"
    assert margin_text({"margin": 671.08864, "max_dev": 1.49e-8}) == "671×"
    _, page, _ = two_ddps
    assert "margin -" not in page   # the old rendering of a JSON null margin: "margin -x"
    section = re.search(r'<details class="impl" id="impl-ref".*?</details>', page, re.S).group(0)
    exact = re.search(r"<tr[^>]*><td>parity.linear</td><td>loss_parity</td>(.*?)</tr>", section, re.S).group(1)
    assert "dev 0.00e+00 / bound 1.00e-05 · margin ∞ (exact)" in exact, exact
    ranks = re.search(r"<tr[^>]*><td>invariant.ranks</td><td>ranks</td>(.*?)</tr>", section, re.S).group(1)
    assert "margin" not in ranks and "dev" not in ranks, ranks


def test_labels_come_from_the_verdicts(two_ddps):
    doc, page, _ = two_ddps
    hr = htmlreport()
    impl_label, merge_runs, sensitivity_series = hr.impl_label, hr.merge_runs, hr.sensitivity_series
    assert impl_label({"pass": 5, "vacuous": 1}) != "correct"
    assert impl_label({"unsupported": 3}) != "correct"
    labels = {lab for panel in sensitivity_series(merge_runs([doc])).values() for s in panel.values()
              for lab, _, _ in s["lines"]}
    assert "ref (correct)" in labels, labels
    assert [lab for lab in labels if lab.startswith("broken")], labels
    assert not [lab for lab in labels if lab.startswith("broken") and "correct" in lab], labels
    rows = dict(re.findall(r'<tr class="impl-row" data-impl="([^"]+)">(.*?)</tr>', page, re.S))
    assert re.search(r"<b>correct( on [\d.]+ % of its verdicts \(\d+ not tested\))?</b>", rows["ref"]), rows["ref"]
    assert "correct" not in rows["broken"] and "NOT conformant: 2 fail, 1 vacuous" in rows["broken"]
    assert re.search(r'<p id="overall" class="bad"><b>FAIL: 3 failing or vacuous verdict\(s\) in 1 of 2 ', page)


def test_each_ddp_counted_on_its_own(two_ddps):
    _, page, _ = two_ddps
    rows = dict(re.findall(r'<tr class="impl-row" data-impl="([^"]+)">(.*?)</tr>', page, re.S))
    assert set(rows) == {"ref", "broken"}

    def counts(row):
        return {k: int(n) for k, n in re.findall(r'class="num count-(\w+)">(\d+)<', row)}
    assert counts(rows["ref"]) == {"pass": 3, "fail": 0, "vacuous": 0, "unsupported": 1, "skip": 0, "xfail": 0}
    assert counts(rows["broken"]) == {"pass": 1, "fail": 2, "vacuous": 1, "unsupported": 0, "skip": 0, "xfail": 0}
    summaries = dict(re.findall(r'<details class="impl" id="[^"]+" data-impl="([^"]+)"><summary>.*?'
                                r'<span class="impl-counts">([^<]*)</span>', page, re.S))
    assert summaries == {"broken": "1 pass, 2 fail, 1 vacuous", "ref": "3 pass, 1 unsupported"}


def test_failures_come_first(two_ddps):
    _, page, _ = two_ddps
    failing = ["parity.linear:param_parity[broken-cpu-w2]", "parity.mlp:loss_parity[broken-cpu-w2]",
               "parity.linear:loss_parity[broken-cpu-w2]"]   # fail, fail, then vacuous
    assert _ids(page, "failure-row") == failing
    # the failures section comes before every per-implementation table and the kill matrix
    first_impl = page.index('<details class="impl"')
    assert page.index('id="failures"') < page.index('id="failures-table"') < first_impl
    assert page.index("</table>", page.index('id="failures-table"')) < first_impl
    assert page.index("Mutant kill matrix") > first_impl
    # inside a DDP's table the failing rows come first
    section = re.search(r'<details class="impl" id="impl-broken".*?</details>', page, re.S).group(0)
    classes = re.findall(r'<tr class="(verdict-row[^"]*)"><td>([^<]+)</td><td>([^<]+)</td>', section)
    assert [c for c, _, _ in classes] == ["verdict-row bad"] * 3 + ["verdict-row"], classes
    assert ("verdict-row", "parity.mlp", "param_parity") == classes[-1]
    # a run without failures says so
    assert "None: no verdict failed" not in page


# --- the sensitivity figure's layout (issue 29 item 7g): numbers, not pixels ----------------

MODELS11 = ("linear", "mlp", "batchnorm", "float64", "complex64", "channels_last", "sparse_embedding",
            "mixed_dtype", "shared_branches", "checkpoint_reentrant", "checkpoint_nonreentrant")


def _eleven_models_doc():
    """The parity table's 11 models at W=2 and 3; float64 deviations ~1e-16 under a bound of
    1e-12 with exact zeros; the other bounds are verdict atols (atol + rtol*|ref|), not 1e-5."""
    vs, kills = [], []
    for w in (2, 3):
        for m in MODELS11:
            f64 = m == "float64"
            atol = 1e-12 if f64 else 3.7e-5
            v = _verdict("param_parity", "ref", m, 4e-16 if f64 else 2e-8, atol=atol, w=w)
            if f64:
                v.per_step = [0.0, 1e-17, 4e-16, 0.0, 2e-16]
            vs.append(v)
            kills.append(KillRow("cpu", w, "sum_not_mean", f"parity.{m}",
                                 [_verdict("param_parity", "mutant:sum_not_mean", m, 3e-2, atol=atol, w=w)]))
    return {"verdicts": [v.to_json() for v in vs], "kill_matrix": [k.to_json() for k in kills]}


def test_sensitivity_figure_wraps_small_multiples_and_keeps_points_and_bound_in_view():
    hr = htmlreport()
    series = hr.sensitivity_series(hr.merge_runs([_eleven_models_doc()]))
    from conformance.report import plots
    fig = plots.sensitivity_figure(series)
    try:
        assert fig.get_figwidth() * plots.SENS_DPI <= 1400  # was 5,995 px: 11 panels a row
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.lines]
        assert len(panels) == 22
        rows: dict = {}
        for ax in panels:
            rows.setdefault(round(ax.get_position().y0, 3), []).append(ax)
        assert 2 <= max(len(r) for r in rows.values()) <= 4 and len(rows) == 6, {k: len(r) for k, r in rows.items()}
        for ax in panels:
            lo, hi = ax.get_ylim()
            model, _, panel = ax.get_title().split("  ")[0].partition(" · ")
            assert ax.get_yscale() == "log" and model in MODELS11 and panel in ("cpu-w2", "cpu-w3")
            drawn = [y for line in ax.lines for y in line.get_ydata()]
            assert drawn and all(lo < y < hi for y in drawn), (ax.get_title(), lo, hi, drawn)
            bound = [line for line in ax.lines if line.get_color() == "red"]
            want = 1e-12 if model == "float64" else 3.7e-5  # the verdicts' atol field
            assert len(bound) == 1 and list(bound[0].get_ydata()) == [want, want], ax.get_title()
            if model == "float64":  # the correct line under the bound, its zeros at the bottom
                correct = [line for line in ax.lines if line.get_label() == "ref (correct)"][0]
                ys = list(correct.get_ydata())
                assert max(ys) < want and min(ys) > lo and ys[0] == ys[3] == min(ys), ys
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_sensitivity_caption_says_what_the_bound_is(two_ddps):
    _, page, _ = two_ddps
    caption = re.search(r"<h2>Sensitivity</h2>\s*<p>(.*?)</p>", page, re.S).group(1)
    assert "<code>atol</code> field, which is atol + rtol × |reference| at the worst element" in caption
    assert "tolerance table's atol (red dashed)" not in caption
