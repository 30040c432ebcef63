"""Every check of the case table has a sentence of what the reference does, with its upstream
source (issue 29 item 8), and the failures file prints it under a failing verdict."""
import pytest

from conformance.cases.semantics import CHECK_SEMANTICS, expected_behaviour
from conformance.cases.table import CASES


def test_every_check_of_the_table_says_what_the_reference_does():
    missing = sorted({ch for c in CASES.values() for ch in c.checks} - set(CHECK_SEMANTICS))
    assert not missing, f"add a sentence and its source to CHECK_SEMANTICS for {missing}"
    for check, (sentence, source) in CHECK_SEMANTICS.items():
        assert len(sentence) > 30 and source, check


def test_the_sentence_follows_the_family():
    assert "broadcast_buffers=False" in expected_behaviour(CASES["feature.broadcast_buffers_off"], "buffer_parity")
    ddp = expected_behaviour(CASES["parity.linear"], "agreement")
    coll = expected_behaviour(CASES["collective.all_reduce"], "agreement")
    assert "_sync_module_states" in ddp and "result" in coll and ddp != coll


@pytest.mark.cpu
def test_failures_file_says_what_the_reference_does(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--ddp", "mutant:buffers_not_broadcast",
                        "--world-size", "2", "--only", "feature.broadcast_buffers_on", "--quiet", "--json",
                        str(tmp_path / "r.json")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    text = (tmp_path / "r.failures.txt").read_text()
    assert "expected: broadcast_buffers=True: a buffer rank 0 changes" in text
    from conformance.cases.semantics import CHECK_SEMANTICS
    assert f"(upstream: {CHECK_SEMANTICS['buffers'][1]})" in text
