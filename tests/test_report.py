"""``python -m conformance report``: the HTML renders in a real headless Chromium
(table rows and the embedded PNG with a non-zero natural size)."""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest

from conformance.report.text import KillRow
from conformance.verdict import Verdict
from conformance.report.text import write_json

pytestmark = pytest.mark.cpu

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Written into the page before --dump-dom: every image's natural size once loaded.
PROBE = """<script>
window.addEventListener("load", function () {
  var p = document.createElement("pre"); p.id = "probe";
  p.textContent = JSON.stringify(Array.prototype.map.call(document.images, function (i) {
    return {id: i.id, w: i.naturalWidth, h: i.naturalHeight, complete: i.complete,
            data: i.src.indexOf("data:image/png;base64,") === 0};
  }));
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
    # self-contained: no external resource; the PNG written next to it is the one embedded
    assert not re.search(r'(src|href)="(?!data:)', page)
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
    # the conformance table: one row per (case, check), statuses as coloured cells
    rows = re.findall(r'<tr class="verdict-row">(.*?)</tr>', html, re.S)
    assert len(rows) == 5, html[:3000]
    assert any("param_parity" in row and "parity.linear" in row for row in rows)
    assert 'class="status-pass"' in html and 'class="status-unsupported"' in html
    kill_rows = re.findall(r'<tr class="kill-row">(.*?)</tr>', html, re.S)
    assert len(kill_rows) == 4
    # an unsupported mutant is grey "unsupported", not a red NO
    join = next(r for r in kill_rows if "join_dropped" in r)
    assert "unsupported" in join and "#ef9a9a" not in join
    probe = re.search(r'<pre id="probe">(.*?)</pre>', html, re.S)
    assert probe, "the probe script did not run (no <pre id=probe> in the dumped DOM)"
    images = json.loads(probe.group(1).replace("&quot;", '"'))
    sens = [i for i in images if i["id"] == "sensitivity-plot"]
    assert sens and sens[0]["data"] and sens[0]["complete"], images
    assert sens[0]["w"] > 400 and sens[0]["h"] > 200, images

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
