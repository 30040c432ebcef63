"""The faces iterate one table: the CLI, the pytest plugin and the absltest face give
the same verdicts; bad input to any face is one ``error:`` line."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, cwd, timeout=900, env=None):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.long
def test_cli_and_pytest_give_the_same_verdict_ids(tmp_path):
    """Whole table, ref, CPU W=2: the same set of verdict ids (and statuses) from both faces
    (the smallest example budget: ids do not depend on it)."""
    env = dict(os.environ, CONFORMANCE_PROFILE="dev")
    cli = run(["-m", "conformance", "run", "--runtime", "cpu", "--world-size", "2", "--ddp", "ref",
               "--quiet", "--json", str(tmp_path / "cli.json")],
              cwd=tmp_path, env=env)
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-3000:]
    py = run(["-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider", "-q", "-m", "cpu",
              "--conformance-runtime", "cpu", "--conformance-world-size", "2", "--conformance-ddp", "ref",
              "--conformance-json", str(tmp_path / "py.json")],
             cwd=tmp_path, env=env)
    assert py.returncode == 0, py.stdout[-3000:] + py.stderr[-3000:]
    a = {v["id"]: v["status"] for v in json.loads((tmp_path / "cli.json").read_text())["verdicts"]}
    b = {v["id"]: v["status"] for v in json.loads((tmp_path / "py.json").read_text())["verdicts"]}
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    assert a == b
    from conformance.cases.table import CASES
    assert {i.split(":")[0] for i in a} == set(CASES)  # every case of the table ran


USER_TEST = '''
from conformance.absltest import ConformanceTestCase, main


class UserConformance(ConformanceTestCase):
    DDP = "ref"


if __name__ == "__main__":
    main()
'''


@pytest.mark.long
@pytest.mark.parametrize("ddp,rc,needle", [("ref", 0, "OK"),
                                           ("mutant:sum_not_mean", 1, "parity.linear:param_parity")])
def test_absltest_user_file(tmp_path, ddp, rc, needle):
    (tmp_path / "user_conformance_test.py").write_text(USER_TEST)
    env = dict(os.environ, PYTHONPATH=REPO)
    r = run(["user_conformance_test.py", f"--ddp={ddp}", "--only=parity.linear,no_sync"], cwd=tmp_path, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == rc, out[-3000:]
    assert needle in out
    from conformance.cases.table import CASES
    from conformance.cases.train.usercases import user_case_rows
    assert f"Ran {len(CASES) + len(user_case_rows())} tests" in out  # one method per case (and per --model case)


@pytest.mark.parametrize("args,needle", [
    (["--runtime=tpu"], "unknown runtime 'tpu'"),
    (["--ddp=bogus"], "unknown DDP implementation 'bogus'"),
    (["--only=nope"], "unknown tag(s) nope"),
    (["--world_size=1"], "world size >= 2"),
    (["--profile=huge"], "unknown profile"),
    (["--expected_failures=/no/such/file"], "cannot read"),
    (["--bogus_flag=1"], "Unknown command line flag 'bogus_flag'"),
])
def test_absltest_bad_input_one_line_exit_2(tmp_path, args, needle):
    r = run(["-m", "conformance.absltest", *args], cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--conformance-only", "nope"], "unknown tag(s) nope"),
    (["--conformance-ddp", "bogus"], "unknown DDP implementation 'bogus'"),
    (["--conformance-expected-failures", "/no/such/file"], "cannot read"),
])
def test_pytest_bad_input_is_a_usage_error(tmp_path, args, needle):
    r = run(["-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider", "--collect-only", *args],
            cwd=tmp_path)
    assert r.returncode == 4 and needle in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
