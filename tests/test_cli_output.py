"""What keeps a run's output (conformance.cli.output): the report lock, --json -, signals."""
import os
import signal
import subprocess
import sys

import pytest

from conformance.cli.output import Interrupted, ReportLock, lock_path, signals_raise, stdout_for_json
from conformance.errors import UsageError


def test_second_lock_on_the_same_report_names_the_holder(tmp_path):
    report = tmp_path / "conformance-report.json"
    with ReportLock(str(report)) as first:
        assert first.path == str(tmp_path / "conformance-report.json.lock")
        assert (tmp_path / "conformance-report.json.lock").read_text().strip() == str(os.getpid())
        for alias in (str(report), os.path.join(str(tmp_path), ".", "conformance-report.json")):
            with pytest.raises(UsageError, match=rf"another run \(pid {os.getpid()}\) is writing this report"):
                ReportLock(alias).acquire()
    assert not (tmp_path / "conformance-report.json.lock").exists()  # released and removed
    with ReportLock(str(report)):  # free again
        pass


def test_lock_held_by_another_process_until_it_exits(tmp_path):
    """flock is per open file: another process is refused while the holder lives, and the
    kernel frees the lock when the holder dies (a stale lock file is taken over)."""
    report = str(tmp_path / "r.json")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from conformance.cli.output import ReportLock; "
                               f"ReportLock({report!r}).acquire(); print('locked', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UsageError, match=rf"pid {holder.pid}\b"):
            ReportLock(report).acquire()
    finally:
        holder.kill()
        holder.wait(60)
    assert os.path.exists(lock_path(report))  # SIGKILL: the file stays, the lock does not
    with ReportLock(report):
        pass


def test_sigterm_raises_interrupted_inside_and_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as exc:
        with signals_raise():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10 ** 6):  # the handler runs between bytecodes
                pass
    assert isinstance(exc.value, KeyboardInterrupt) and exc.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_stdout_for_json_moves_everything_else_to_stderr(capfd):
    with stdout_for_json("-") as out:
        print("table")  # python-level
        os.write(1, b"from C\n")  # fd-level, as a library would
        out.write('{"a": 1}\n')
    print("after")
    got = capfd.readouterr()
    assert got.out == '{"a": 1}\nafter\n', got
    assert "table" in got.err and "from C" in got.err
