"""Every standalone reproducer in docs/findings/ still shows its finding.

Each reproducer is run as its own subprocess (it spawns its replicas itself)
with a bound; exit code 0 means the finding reproduces, 3 that it no longer
does (then docs/findings.md must be updated), anything else an error.
"""
import pathlib
import subprocess
import sys

import pytest

FINDINGS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "findings"
REPRODUCERS = sorted(FINDINGS.glob("*.py"))
# Bound per reproducer: torch.compile in two processes on a loaded 2-core
# machine took minutes (measured); the reproducers bound their replicas lower.
SUBPROCESS_TIMEOUT_S = 1200
NO_LONGER_REPRODUCES = 3


@pytest.mark.long
@pytest.mark.cpu
@pytest.mark.parametrize("script", REPRODUCERS, ids=[p.stem for p in REPRODUCERS])
def test_finding_reproduces(script):
    if script.stem.startswith("xla_"):  # a torch_xla finding: runs where torch_xla is installed
        pytest.importorskip("torch_xla")
    if script.stem.startswith("engine_"):  # an engine's finding: runs where its extra is installed
        pytest.importorskip(script.stem.split("_")[1])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, cwd=script.parent)
    tail = "\n".join(proc.stdout.splitlines()[-6:])
    if proc.returncode == NO_LONGER_REPRODUCES:
        pytest.fail(f"{script.name} no longer reproduces; update docs/findings.md:\n{tail}",
                    pytrace=False)
    assert proc.returncode == 0, (
        f"{script.name} exited {proc.returncode}:\n{tail}\n{proc.stderr[-2000:]}")


def test_every_reproducer_is_listed():
    """docs/findings.md names every reproducer (and the reverse)."""
    text = (FINDINGS.parent / "findings.md").read_text()
    assert REPRODUCERS, "no reproducers found"
    for p in REPRODUCERS:
        assert f"findings/{p.name}" in text, f"{p.name} is not listed in docs/findings.md"
