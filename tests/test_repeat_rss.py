"""``run --repeat`` reports each replica host's resident set (conformance/worlds/procmem.py)."""
import json
import os
import subprocess
import sys

import pytest

from conformance.worlds.procmem import peak_rss_mib, rss_mib

pytestmark = pytest.mark.cpu

# A host has imported torch before its first reading: far above this (about 220 MiB
# with torch 2.13). A reading in kB or bytes instead of MiB, or of the wrong field, misses it.
MIN_HOST_MIB = 50


def test_procmem_reads_this_process():
    now, peak = rss_mib(os.getpid()), peak_rss_mib(os.getpid())
    assert now is not None and peak is not None and 0 < now <= peak


def test_procmem_gone_process_is_none():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert rss_mib(p.pid) is None and peak_rss_mib(p.pid) is None


@pytest.mark.long
def test_repeat_reports_host_rss(tmp_path):
    out = tmp_path / "repeat.json"
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--repeat", "2", "--runtime", "cpu",
                        "--world-size", "2", "--ddp", "ref", "--only", "parity.linear", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["host_rss"]
    assert [(x["runtime"], x["world_size"], x["host"]) for x in rows] == [("cpu", 2, 0), ("cpu", 2, 1)], rows
    assert len({x["pid"] for x in rows}) == 2, rows
    for x in rows:
        for key in ("start_mib", "after_first_mib", "end_mib"):
            assert isinstance(x[key], float) and x[key] > MIN_HOST_MIB, (key, x)
        assert x["restarted"] is False, x
        assert f"cpu W=2 host {x['host']} (pid {x['pid']}): {x['start_mib']:.1f} / " \
               f"{x['after_first_mib']:.1f} / {x['end_mib']:.1f}" in r.stdout, r.stdout
