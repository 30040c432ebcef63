"""The CLI: bad input gives one clear line and exit code 2; a run prints the
table and writes JSON."""
import json
import os
import pathlib
import signal
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import conformance

from tests.procs import alive, cmdline, default_signals, descendants, gone, script_beside_python, write_user_package

pytestmark = pytest.mark.cpu


def run_cli(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("args,needle", [
    (["--runtime", "tpu"], "unknown runtime 'tpu'"),
    (["--ddp", "no_such_pkg.mod:DDP"], "cannot import 'no_such_pkg.mod'"),
    (["--ddp", "json:NoSuchClass"], "has no callable 'NoSuchClass'"),
    (["--ddp", "bogus"], "unknown DDP implementation 'bogus'"),
    (["--ddp", "mutant:nope"], "unknown mutant 'nope'"),
    (["--world-size", "1"], "world size >= 2"),
    (["--world-size", "two"], "not a comma list of integers"),
    (["--world-size", "99"], "--world-size 99: runtime cpu runs world sizes 2..16"),
    (["--runtime", "cpu,pjrt", "--world-size", "2,17"], "--world-size 17: runtime cpu runs world sizes 2..16"),
    (["--only", "resnet"], "unknown tag(s) resnet"),
    (["--skip", "parity,bogus"], "unknown tag(s) bogus"),
    (["--expected-failures", "/no/such/file"], "cannot read"),
    (["--profile", "huge"], "unknown profile 'huge'"),
    (["--replica-timeout", "abc"], "invalid float value"),
    (["--replica-timeout", "0"], "need seconds > 0"),
    (["--lanes", "0"], "--lanes / CONFORMANCE_LANES: need a whole number of lanes from 1 to 8"),
    (["--lanes", "2.5"], "invalid int value"),
    (["--topology-nodes", "0"], "--topology-nodes / CONFORMANCE_TOPOLOGY_NODES: need a whole number from 1 to 9"),
    (["--topology-nodes", "10"], "need a whole number from 1 to 9, got 10"),
    (["--topologies", "-1"], "--topologies / CONFORMANCE_TOPOLOGIES: need a whole number from 0 to 100000"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--exitfirst", "--launcher", "env"], "--exitfirst: a launcher-built world"),
    (["--exitfirst-each", "--launcher", "env"], "--exitfirst-each: a launcher-built world"),
    (["--exitfirst", "--exitfirst-each"], "pick one"),
])
def test_bad_input_one_line_exit_2(args, needle, tmp_path):
    r = run_cli("run", *args, cwd=tmp_path)  # its own folder: the default report's lock is per folder (xdist)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


@pytest.mark.parametrize("args", [
    ["--runtime", "tpu"], ["--runtime", "cpu,nope"], ["--ddp", "no_such_pkg.mod:DDP"], ["--world-size", "1"],
    ["--expected-failures", "/no/such/file"], ["--replica-timeout", "0"], ["--profile", "huge"],
    ["--json", "/no/such/folder/r.json"], ["--world-size", "99"],
    # names checked against the case table, the implementation rows and the mutant catalog
    ["--only", "nosuchtag"], ["--skip", "parity,bogus"], ["--ddp", "nosuch"], ["--ddp", "ref,mutant:nope"],
    ["--exitfirst", "--exitfirst-each"], ["--exitfirst", "--launcher", "env"],
])
def test_usage_errors_come_before_torch(args):
    """Usage errors come at once, before torch loads: counted by what is imported, not by a wall
    time that load would stretch."""
    code = ("import sys\nfrom conformance.cli import main\n"
            f"rc = main(['run', *{args!r}])\nprint(rc, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_error_after_the_fork_server_started_leaves_no_process(tmp_path):
    """``--ddp json:NoSuchClass`` is refused after torch loaded, so after the hosts' fork server
    started (conformance.worlds.hoststart.start_server): the CLI kills it on the way out, where
    the server would otherwise finish its imports (seconds) on its own. The CLI's process group
    holds whatever it started (multiprocessing's resource tracker, which exits by itself, is not
    the server)."""
    err_file = tmp_path / "stderr"
    with open(err_file, "w") as err_out:  # not a pipe: a pipe's reader would wait for the server too
        proc = subprocess.Popen([sys.executable, "-m", "conformance", "run", "--ddp", "json:NoSuchClass"],
                                stdout=subprocess.DEVNULL, stderr=err_out, cwd=tmp_path, start_new_session=True)
        proc.wait(timeout=300)
    err = err_file.read_text()
    assert proc.returncode == 2 and err.startswith("error: ") and "NoSuchClass" in err, err
    left = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if _pgid(pid) == proc.pid and "multiprocessing.forkserver" in cmdline(pid)]
    assert not left, f"fork server(s) {left} outlived the CLI"


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_the_name_check_reads_the_tables_before_torch():
    """The CLI checks ``--only`` / ``--skip`` tags and ``--ddp`` names against the tables themselves
    (the case table, the implementation rows, the mutant catalog), which load without torch: every
    name of the tables passes, an unknown tag, implementation or mutant is one ``error:`` line
    listing the tables' names, and torch is never imported."""
    code = (
        "import sys\n"
        "from conformance.cli import main, parse\n"
        "from conformance.cases.table import all_tags\n"
        "from conformance.impls.builtin import ROWS\n"
        "from conformance.impls.mutants.catalog import MUTANTS\n"
        "parse(['run', '--only', ','.join(sorted(all_tags())), '--skip', 'parity.mlp', '--ddp', "
        "','.join(['all', *ROWS, *('mutant:' + m for m in MUTANTS)])])\n"
        "codes = [main(['run', *a]) for a in (['--only', 'nosuchtag'], ['--skip', 'parity,bogus'], "
        "['--ddp', 'nosuch'], ['--ddp', 'ref,mutant:nope'])]\n"
        "print(','.join(map(str, codes)), 'torch' in sys.modules, ','.join(ROWS), ','.join(MUTANTS))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    out = r.stdout.split()
    assert len(out) == 4, r.stdout + r.stderr
    codes, torch_loaded, rows, mutants = out
    assert (codes, torch_loaded) == ("2,2,2,2", "False"), r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), r.stderr
    assert "--only: unknown tag(s) nosuchtag; use a family (parity," in lines[0]
    assert "--skip: unknown tag(s) bogus;" in lines[1]
    assert f"unknown DDP implementation 'nosuch'; use one of {rows.replace(',', ', ')}, all," in lines[2]
    assert lines[3] == f"error: unknown mutant 'nope'; known: {mutants.replace(',', ', ')}"


def test_world_size_bounds_are_the_adapters_and_say_the_range():
    """The early bound (settings.max_world_size, read before torch loads) is each adapter's; an
    adapter's own refusal names the size it runs, not a range that starts at 1."""
    from conformance.settings import max_world_size
    from conformance.worlds.runtimes import RUNTIMES, RuntimeUnavailable, get_runtime
    assert {rt: max_world_size(rt) for rt in RUNTIMES} == {"cpu": 16, "pjrt": 16, "xrt": 8}
    for rt in RUNTIMES:
        assert get_runtime(rt).max_world_size == max_world_size(rt), rt
    assert max_world_size("tpu") is None
    from ddp_impl.runtime.xrt import DEFAULT_TPU_DEVICES
    assert max_world_size("xrt") == DEFAULT_TPU_DEVICES
    with pytest.raises(RuntimeUnavailable, match=r"^world size 99 is above 16, the largest runtime cpu runs$"):
        get_runtime("cpu").check(99)


def test_console_script_resolves_a_package_in_the_current_folder(tmp_path):
    """``ddp-conformance run --ddp mypkg.ddp:X`` from the folder holding ``mypkg``: the console
    script, unlike ``python -m``, does not put that folder on ``sys.path`` (it reported "No module
    named 'mypkg'"). The module is found: the error is about the missing class."""
    script = script_beside_python("ddp-conformance")
    write_user_package(tmp_path)
    kit = os.path.dirname(os.path.dirname(os.path.abspath(conformance.__file__)))
    env = {**os.environ, "PYTHONPATH": kit}  # the kit as imported here; not the package's folder
    r = subprocess.run([script, "run", "--ddp", "mypkg.ddp:Nope", "--world-size", "2", "--only", "parity.linear"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "module 'mypkg.ddp' has no callable 'Nope'" in r.stderr, r.stderr


def test_run_prints_table_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    r = run_cli("run", "--runtime", "cpu", "--world-size", "2", "--ddp", "torch,ref", "--only", "parity.linear",
                "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "param_parity" in r.stdout and "8 pass, 0 fail" in r.stdout
    # stderr is a pipe here: one progress line per finished case run, with counts so far
    assert "progress: 1/2 case runs (50%), 4 pass, 0 fail" in r.stderr and "progress: 2/2" in r.stderr, r.stderr
    doc = json.loads(out.read_text())
    statuses = {(v["check"], v["impl"]): v["status"] for v in doc["verdicts"]}
    assert statuses == {(c, i): "pass" for c in ("param_parity", "loss_parity", "agreement", "transparency")
                        for i in ("torch", "ref")}
    from tests.test_doc_drift import report_keys_undocumented
    assert report_keys_undocumented(doc) == []  # docs/report-format.md names every key


def test_exitfirst_each_stops_each_implementation_at_its_first_failure(tmp_path):
    """Two DDPs in one run: the mutant stops at parity.linear (W=2, so W=3 is not run for it
    either), the reference runs every selected case at both world sizes."""
    out = tmp_path / "r.json"
    r = run_cli("run", "--ddp", "mutant:sum_not_mean,ref", "--world-size", "2,3",
                "--only", "parity.linear,parity.mlp", "--exitfirst-each", "--quiet", "--json", str(out))
    assert " fail " in r.stdout  # a failing implementation: exit 1 and fail rows in the table
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    ran = {(v["impl"], v["case"], v["world_size"]) for v in doc["verdicts"]}
    assert {(c, w) for i, c, w in ran if i == "mutant:sum_not_mean"} == {("parity.linear", 2)}
    assert {(c, w) for i, c, w in ran if i == "ref"} == {(c, w) for c in ("parity.linear", "parity.mlp")
                                                         for w in (2, 3)}
    assert list(doc["stopped_at_each"]) == ["mutant:sum_not_mean"]
    assert doc["stopped_at_each"]["mutant:sum_not_mean"].startswith("parity.linear:")


def test_lanes_keep_the_verdicts_of_one_lane_in_table_order(tmp_path):
    """Two lanes finish case runs out of order; the report is the one a single lane writes:
    the same verdicts, in table order (a failing and a passing implementation, two sizes)."""
    docs = {}
    for lanes in ("1", "2"):
        out = tmp_path / f"r{lanes}.json"
        r = run_cli("run", "--ddp", "mutant:sum_not_mean,ref", "--world-size", "2,3", "--lanes", lanes,
                    "--only", "parity.linear,parity.mlp,feature.no_sync", "--quiet", "--json", str(out))
        assert r.returncode == 1, r.stdout + r.stderr
        docs[lanes] = [(v["id"], v["status"]) for v in json.loads(out.read_text())["verdicts"]]
    assert docs["2"] == docs["1"]
    assert {s for _, s in docs["2"]} >= {"pass", "fail"} and len(dict(docs["2"])) == len(docs["2"])  # each once


def test_exitfirst_stops_after_the_first_failing_case(tmp_path):
    """sum_not_mean fails parity.linear (the first selected case): -x stops there, exit 1."""
    out = tmp_path / "r.json"
    r = run_cli("run", "--ddp", "mutant:sum_not_mean", "--only", "parity.linear,parity.mlp", "-x",
                "--json", str(out))
    doc = json.loads(out.read_text())
    assert r.returncode == 1 and "stopped at the first failure" in r.stdout, r.stdout + r.stderr
    assert {v["case"] for v in doc["verdicts"]} == {"parity.linear"}
    assert doc["stopped_at"].startswith("parity.linear:")


def test_expected_failures_turn_fail_into_xfail_and_warn(tmp_path):
    xf = tmp_path / "xfails.txt"
    xf.write_text("# known gaps\nparity.linear:param_parity[mutant:sum_not_mean-cpu-w2]\n"
                  "parity.linear:agreement[mutant:sum_not_mean-cpu-w2]  # passes: warned\n"
                  "parity.gone:param_parity[mutant:sum_not_mean-cpu-w2]\n")
    r = run_cli("run", "--ddp", "mutant:sum_not_mean", "--world-size", "2", "--only", "parity.linear", "--expected-failures",
                str(xf), "--json", str(tmp_path / "r.json"))
    # loss_parity still fails (not listed): exit 1; the listed one is xfail
    doc = json.loads((tmp_path / "r.json").read_text())
    st = {v["check"]: v["status"] for v in doc["verdicts"]}
    assert st["param_parity"] == "xfail" and st["agreement"] == "pass", st
    assert "no longer fails" in r.stderr and "matches no verdict" in r.stderr, r.stderr
    assert r.returncode == (1 if st["loss_parity"] == "fail" else 0)


def test_unsupported_feature_is_visible_in_the_table(tmp_path):
    r = run_cli("run", "--ddp", "ref", "--only", "join", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "unsupported" in r.stdout and "has no join()" in r.stdout


def test_only_and_skip_select_by_tag(tmp_path):
    r = run_cli("run", "--ddp", "ref", "--world-size", "2", "--only", "property", "--skip", "property.allreduce_mean,"
                "property.broadcast,property.scale_linearity,property.full_batch_grad,property.rank_permutation",
                "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [v["case"] for v in doc["verdicts"]] == ["property.no_sync_accumulation"]


# --- nothing lost: early errors, --json -, --junitxml, the report lock, signals -------------

def test_binary_expected_failures_file_is_one_error_line(tmp_path):
    bad = tmp_path / "xfails.bin"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe garbage")
    r = run_cli("run", "--expected-failures", str(bad), "--json", str(tmp_path / "r.json"), timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") \
        and "not a text file" in lines[0], r.stderr


def test_garbage_expected_failures_file_is_one_error_line_before_torch(tmp_path):
    """Random words are no entries: exit 2 at once, not warnings and exit 0."""
    bad = tmp_path / "xfails.txt"
    bad.write_text("the quick brown fox\njumps over\nparity.linear\n")
    code = ("import sys\nfrom conformance.cli import main\n"
            f"rc = main(['run', '--expected-failures', {str(bad)!r}, '--json', {str(tmp_path / 'r.json')!r}])\n"
            "print(rc, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --expected-failures ") \
        and "line 1: 'the quick brown fox' is not an entry" in lines[0], r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--junitxml", "/no/such/folder/j.xml"], "--junitxml /no/such/folder/j.xml: folder /no/such/folder does not exist"),
    (["--junitxml", "-"], "--junitxml -: give a file path"),
    (["--json", "same.xml", "--junitxml", "same.xml"], "the same file as --json"),
    (["--json", "."], "is a folder"),
])
def test_bad_output_path_is_one_error_line(tmp_path, args, needle):
    r = run_cli("run", *args, cwd=tmp_path, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_json_dash_is_stdout_with_junit_and_expected_patterns(tmp_path):
    """--json -: stdout is the JSON alone (the table goes to stderr) and no file named '-';
    --junitxml: one testcase per verdict, its element by status; expected-failures entries
    in case:check and pattern form make the mutant's failures xfail."""
    xf = tmp_path / "xfails.txt"
    xf.write_text("parity.linear:param_parity      # a case:check (ref passes it, the mutant fails it)\n"
                  "parity.*:loss_parity[mutant:sum*-cpu-w*]  # a pattern\n")
    r = run_cli("run", "--ddp", "mutant:sum_not_mean,ref", "--world-size", "2", "--only", "parity.linear",
                "--json", "-", "--junitxml", "j.xml", "--expected-failures", str(xf), cwd=tmp_path)
    doc = json.loads(r.stdout)  # nothing else on stdout
    assert "param_parity" in r.stderr and "JSON report: stdout" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j.xml", "xfails.txt"]  # no '-', no failures file
    st = {(v["impl"], v["check"]): v["status"] for v in doc["verdicts"]}
    assert st == {("mutant:sum_not_mean", "param_parity"): "xfail", ("mutant:sum_not_mean", "loss_parity"): "xfail",
                  ("mutant:sum_not_mean", "agreement"): "pass", ("mutant:sum_not_mean", "transparency"): "pass",
                  ("ref", "param_parity"): "pass", ("ref", "loss_parity"): "pass", ("ref", "agreement"): "pass",
                  ("ref", "transparency"): "pass"}, st
    assert r.returncode == 0, r.stderr
    assert doc["complete"] is True and doc["interrupted"] is False
    assert "warning" not in r.stderr
    import xml.etree.ElementTree as ET
    cases = {f'{tc.get("classname")}:{tc.get("name")}': tc for tc in ET.parse(tmp_path / "j.xml").iter("testcase")}
    assert set(cases) == {v["id"] for v in doc["verdicts"]}
    for v in doc["verdicts"]:
        kids = [(c.tag, c.get("type")) for c in cases[v["id"]]]
        assert kids == ({"pass": [], "xfail": [("skipped", "pytest.xfail")]}[v["status"]]), (v["id"], kids)


def test_junit_failure_carries_the_repro_command(tmp_path):
    r = run_cli("run", "--ddp", "mutant:sum_not_mean", "--world-size", "2", "--only", "parity.linear",
                "--quiet", "--junitxml", "j.xml", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    import xml.etree.ElementTree as ET
    root = ET.parse(tmp_path / "j.xml").getroot()
    fails = {tc.get("name"): tc.find("failure") for tc in root.iter("testcase") if tc.find("failure") is not None}
    assert "param_parity[mutant:sum_not_mean-cpu-w2]" in fails, list(fails)
    f = fails["param_parity[mutant:sum_not_mean-cpu-w2]"]
    assert f.get("type") == "fail" and f.get("message")
    assert ("reproduce: python -m conformance run --ddp mutant:sum_not_mean --runtime cpu --world-size 2 "
            "--only parity.linear") in f.text
    assert (tmp_path / "conformance-report.json").exists() and (tmp_path / "conformance-report.failures.txt").exists()
    junitparser = pytest.importorskip("junitparser", reason="junitparser is a test dependency")
    read = {c.name: [type(x).__name__ for x in c.result] for suite in junitparser.JUnitXml.fromfile(
        str(tmp_path / "j.xml")) for c in suite}  # what a CI's JUnit reader sees
    assert read["param_parity[mutant:sum_not_mean-cpu-w2]"] == ["Failure"], read


def test_second_run_on_the_same_report_is_refused_while_the_first_runs(tmp_path):
    """Two runs in one folder, default --json: the second fails at once naming the first's pid;
    the first writes its report and removes its lock."""
    first = subprocess.Popen([sys.executable, "-m", "conformance", "run", "--ddp", "ref", "--world-size", "2",
                              "--only", "parity.linear", "--quiet"], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / "conformance-report.json.lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text().strip()) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert lock.exists(), first.communicate()
        second = run_cli("run", "--ddp", "ref", "--world-size", "2", "--only", "parity.linear", cwd=tmp_path,
                         timeout=120)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stdout + second.stderr
        assert lines[0].startswith("error: --json conformance-report.json: another run") \
            and f"(pid {first.pid})" in lines[0], lines
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, out + err
    assert json.loads((tmp_path / "conformance-report.json").read_text())["counts"]["pass"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conformance-report.json"]  # lock removed


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_writes_a_partial_report_and_cleans_up(tmp_path, request, sig):
    """Ctrl-C / SIGTERM once a case has finished (seen in the JSON's progress writes): exit
    128 + signal with one stderr line, a partial JSON marked interrupted with the finished
    verdicts (and the failures file of the failing mutant), no world work directory left in
    the run's temp dir, no host process left."""
    # A short temp dir: the fork server's AF_UNIX socket lives in it (a path of at most 107 bytes).
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="sig"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    report = tmp_path / "r.json"
    child = subprocess.Popen([sys.executable, "-m", "conformance", "run", "--ddp", "mutant:sum_not_mean,ref",
                              "--world-size", "2", "--only", "parity.linear,parity.mlp,parity.batchnorm",
                              "--json", str(report), "--quiet"],
                             cwd=tmp_path, env=dict(os.environ, TMPDIR=str(tmp)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        deadline, progress = time.monotonic() + 600, None
        while child.poll() is None and time.monotonic() < deadline:
            try:
                progress = json.loads(report.read_text())
            except (OSError, ValueError):
                progress = None
            if progress and progress["verdicts"]:
                break
            time.sleep(0.2)
        assert progress and progress["verdicts"] and progress["complete"] is False, child.communicate()
        assert [d for d in os.listdir(tmp) if d.startswith("ddpconf-")]  # a world is up
        hosts = descendants(child.pid)  # the fork server and its world hosts
        child.send_signal(sig)
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + sig, (child.returncode, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"interrupted by {signal.Signals(sig).name} after "), err
    doc = json.loads(report.read_text())
    assert doc["interrupted"] is True and doc["interrupted_by"] == signal.Signals(sig).name
    assert doc["complete"] is False and len(doc["verdicts"]) >= len(progress["verdicts"]) >= 1
    assert doc["finished"]["case_runs"] < doc["finished"]["of"] == 6
    assert any(v["status"] == "fail" for v in doc["verdicts"])  # the mutant's parity.linear, first
    assert (tmp_path / "r.failures.txt").read_text().startswith("=== parity.linear:")
    assert [d for d in os.listdir(tmp) if d.startswith("ddpconf-")] == []
    assert gone(hosts, within=30), [h for h in hosts if alive(h)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.failures.txt", "r.json"]  # no lock, no .tmp


def test_a_run_leaves_only_its_report_in_the_folder_it_starts_in(tmp_path):
    """Hypothesis's files go to the user's cache folder, not a .hypothesis/ in the cwd; a property
    case draws examples, so it would write them."""
    cwd, cache = tmp_path / "cwd", tmp_path / "cache"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env.update(XDG_CACHE_HOME=str(cache), PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(conformance.__file__)), env.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--ddp", "ref", "--world-size", "2",
                        "--only", "property.broadcast", "--quiet"], capture_output=True, text=True,
                       timeout=300, cwd=cwd, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in cwd.iterdir()) == ["conformance-report.json"]
    assert (cache / "ddp-conformance" / "hypothesis").is_dir()


def test_a_world_started_again_after_a_crash_is_a_warning_and_in_the_report(tmp_path):
    """A host that crashed while starting (a runtime registered by the caller, ``tests.tasks:
    CrashingOnce``) costs one more start: the run's verdicts stand, stderr says it once as a
    ``warning:`` line naming the frame, and the JSON report keeps it (``world_restarts``)."""
    report = tmp_path / "r.json"
    code = ("import sys\nfrom conformance.worlds.registry import register\n"
            "register('crash_once', 'tests.tasks:CrashingOnce')\nfrom conformance.cli import main\n"
            f"sys.exit(main(['run', '--runtime', 'crash_once', '--ddp', 'ref', '--world-size', '2', "
            f"'--only', 'parity.linear', '--quiet', '--json', {str(report)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, CONFORMANCE_TEST_CRASHED=str(tmp_path / "crashed")))
    assert r.returncode == 0, r.stdout + r.stderr
    warnings = [line for line in r.stderr.splitlines() if "started again" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: crash_once world of 2 replica(s): host 0"), r.stderr
    assert "(SIGSEGV) while starting at tests/tasks.py:" in warnings[0], warnings
    doc = json.loads(report.read_text())
    assert doc["world_restarts"] == [warnings[0].removeprefix("warning: ")]
    assert doc["counts"]["pass"] == 4 and not doc["counts"].get("fail")
