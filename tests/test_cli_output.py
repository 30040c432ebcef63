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


# --- progress in a log (issue 29 item 5) ---------------------------------------------

class _Log:
    """A stream that is no terminal (a CI log), or a terminal of ``columns`` columns."""

    def __init__(self, tty=False):
        self.lines, self._tty = [], tty

    def write(self, s):
        self.lines += [ln for ln in s.splitlines() if ln]

    def flush(self):
        pass

    def isatty(self):
        return self._tty

    def fileno(self):
        raise OSError("no terminal size")  # what a terminal reporting no size gives


def test_piped_progress_is_one_line_per_case_run_with_counts():
    from conformance.cli.output import LineProgress, progress_bar
    log = _Log()
    bar = progress_bar(3, quiet=False, every=15, counts=lambda: {"pass": 4, "fail": 1, "vacuous": 0}, stream=log)
    try:
        assert isinstance(bar, LineProgress)
        bar.set_description("parity.mlp torch cpu W=2")
        bar.update(1)
        bar.update(1)
    finally:
        bar.close()
    assert len(log.lines) == 2, log.lines
    assert log.lines[1].startswith("progress: 2/3 case runs (66%), 4 pass, 1 fail, ")
    assert log.lines[1].endswith(": parity.mlp torch cpu W=2") and "vacuous" not in log.lines[1]
    assert progress_bar(3, quiet=True, every=15, stream=log) is None


def test_zero_column_terminal_still_shows_progress():
    from conformance.cli.output import LineProgress, progress_bar
    bar = progress_bar(1, quiet=False, every=15, stream=_Log(tty=True))
    bar.close()
    assert isinstance(bar, LineProgress)


def test_a_long_case_prints_a_line_at_least_every_few_seconds():
    """A case run longer than ``every`` seconds still gets lines (a fake clock: no sleeping it out)."""
    import time
    from conformance.cli.output import LineProgress
    now = [0.0]
    log = _Log()
    bar = LineProgress(5, log, every=0.2, clock=lambda: now[0])
    try:
        bar.set_description("scenario.core ref cpu W=3")
        now[0] = 1.0
        deadline = time.monotonic() + 10
        while not log.lines and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        bar.close()
    assert log.lines and log.lines[0] == "progress: 0/5 case runs (0%), 1 s: running scenario.core ref cpu W=3"


def test_progress_every_is_at_most_15_seconds():
    from conformance.settings import Settings
    with pytest.raises(UsageError, match="progress_every"):
        Settings(progress_every=60)
