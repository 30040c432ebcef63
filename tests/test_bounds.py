"""Issue 29 item 2: every printed bound is the bound the verdict used (atol + rtol*|ref| at the
worst element), so no verdict prints a deviation above its bound with status pass."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from conformance.cases.shared.checks import worst_element


def test_worst_element_uses_the_per_element_bound():
    # element 0: dev 3 under bound 4 (rtol part); element 1: dev 1 over bound 0.5
    diff = np.array([[[3.0, 1.0]]])
    bound = np.array([[[4.0, 0.5]]])
    dev, b, per_step = worst_element(diff, bound)
    assert (dev, b) == (1.0, 0.5) and per_step == [1.0]
    dev, b, _ = worst_element(np.array([[[3.0, 0.1]]]), bound)
    assert (dev, b) == (3.0, 4.0) and dev <= b


def test_no_pass_prints_a_deviation_above_its_bound(tmp_path):
    out = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    subprocess.run([sys.executable, "-m", "conformance", "run", "--ddp", "ref", "--world-size", "2",
                    "--only", "parity", "--json", str(out)], check=True, env=env, cwd=tmp_path,
                   capture_output=True, timeout=600)
    verdicts = json.loads(out.read_text())["verdicts"]
    measured = [v for v in verdicts if v["max_dev"] is not None and v["atol"] is not None]
    assert any(v["model"] == "mixed_dtype" for v in measured)  # the rtol row is among them
    for v in measured:
        if v["status"] == "pass":
            assert v["max_dev"] <= v["atol"], v["id"]
            assert v["margin"] is None or v["margin"] >= 1, v["id"]
