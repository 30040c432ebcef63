"""What keeps a run's output from being lost: the report lock, ``--json -`` (stdout is the
JSON), and SIGINT / SIGTERM as exceptions the commands turn into a partial report.

Imports nothing heavy: :func:`conformance.cli.main` uses it before torch is imported.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import sys
import threading
import time

from conformance.errors import UsageError

#: ``--json -``: the report goes to stdout.
STDOUT = "-"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signum`` says which (exit code ``128 + signum``).

    A ``KeyboardInterrupt`` so every ``except KeyboardInterrupt`` / ``except BaseException``
    cleanup of the worlds (kill the hosts, remove the work directory) runs for SIGTERM too.
    """

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def signal_of(exc: KeyboardInterrupt) -> int:
    return getattr(exc, "signum", signal.SIGINT)


def _raise(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def _handled(handler, keep_ignored: bool):
    """SIGINT and SIGTERM go to ``handler`` in the main thread while inside (``keep_ignored``:
    not a signal this process was started with ignored)."""
    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            if not (keep_ignored and signal.getsignal(sig) is signal.SIG_IGN):
                old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def signals_raise():
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread while inside (a context
    manager). A signal this process was started with ignored (``nohup``, a background job of a
    non-interactive shell) stays ignored."""
    return _handled(_raise, keep_ignored=True)


def signals_held():
    """SIGINT and SIGTERM are ignored while inside (a context manager: writing the partial report
    and closing the worlds after a first signal takes seconds; a second one must not lose it)."""
    return _handled(signal.SIG_IGN, keep_ignored=False)


# --- the report lock --------------------------------------------------------------

def lock_path(json_path: str) -> str:
    folder, name = os.path.split(os.path.abspath(json_path))
    return os.path.join(os.path.realpath(folder), name + ".lock")


class ReportLock:
    """An advisory lock (``fcntl.flock``) on ``<json>.lock`` held for a whole run, so two live
    runs never write the same report. The lock file holds the holder's pid; it is removed on
    release. The kernel drops the lock when the process dies, so a killed run leaves at most
    a stale file that the next run takes over.
    """

    def __init__(self, json_path: str):
        self.json_path = json_path
        self.path = lock_path(json_path)
        self._fd = None

    def acquire(self) -> "ReportLock":
        """Raises:
            UsageError: another live run holds the lock (names its pid), or the lock file
                cannot be created.
        """
        for _ in range(20):  # the holder may remove the file between our open and our lock
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise UsageError(f"--json {self.json_path}: cannot create the lock file "
                                 f"{self.path} ({exc.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise UsageError(f"--json {self.json_path}: cannot lock {self.path} "
                                     f"({exc.strerror})") from None
                raise UsageError(f"--json {self.json_path}: another run ({self._holder()}) is "
                                 f"writing this report (lock {self.path}); wait for it or pass another "
                                 "--json PATH") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # we locked a file its holder has just removed: take the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return self
        raise UsageError(f"--json {self.json_path}: cannot take the lock {self.path} (it keeps "
                         "changing)")

    def _holder(self) -> str:
        for _ in range(10):  # the holder writes its pid just after locking
            try:
                with open(self.path) as f:
                    pid = f.read().strip()
            except OSError:
                pid = ""
            if pid.isdigit():
                return f"pid {pid}"
            time.sleep(0.05)
        return "pid unknown"

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if os.fstat(self._fd).st_ino == os.stat(self.path).st_ino:
                os.remove(self.path)  # still locked: nobody can take it between these lines
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def report_lock(command: str, values: dict):
    """The lock a command must hold for its run (a null context when it writes no report
    file: ``--json -``, no ``--json``, or a launched replica other than rank 0)."""
    path = values.get("json")
    if command not in ("run", "repeat", "ranks", "replay") or not isinstance(path, str) or path == STDOUT:
        return contextlib.nullcontext()
    if values.get("launcher") == "env" and os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext()  # rank 0 writes the report of a launched world
    return ReportLock(path)


# --- progress ----------------------------------------------------------------------

class LineProgress:
    """Progress for a log (stderr not a terminal, or a terminal of zero columns): one line per
    finished case run, ``progress: 12/40 case runs (30%), 30 pass, 1 fail, 120 s: <last>``, and
    the same line at least every ``every`` seconds while a case runs (a CI log stays alive).
    The calls of a tqdm bar: ``update(n)``, ``set_description(text)``, ``close()``.

    Args:
        total: case runs of the run.
        stream: where lines go (stderr).
        every: most seconds without a line (:attr:`conformance.settings.Settings.progress_every`).
        counts: ``() -> {status: n}``, the verdicts so far (zero counts other than pass/fail omitted).
    """

    def __init__(self, total: int, stream, every: float, counts=dict, clock=time.monotonic):
        self.total, self.stream, self.every, self.counts, self.clock = total, stream, every, counts, clock
        self.done, self.what, self.t0 = 0, "", clock()
        self.last = self.t0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._beat = threading.Thread(target=self._heartbeat, name="conformance-progress", daemon=True)
        self._beat.start()

    def line(self, running: bool = False) -> str:
        c = self.counts()
        shown = ", ".join(f"{n} {s}" for s, n in c.items() if n or s in ("pass", "fail"))
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        return (f"progress: {self.done}/{self.total} case runs{pct}{', ' + shown if shown else ''}, "
                f"{self.clock() - self.t0:.0f} s" + (f": {'running ' if running else ''}{self.what}" if self.what else ""))

    def _write(self, running: bool = False) -> None:
        with self._lock:
            try:
                self.stream.write(self.line(running) + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # a closed log must not stop the run
                pass
            self.last = self.clock()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            if self.clock() - self.last >= self.every:
                self._write(running=True)

    def update(self, n: int = 1) -> None:
        self.done += n
        self._write()

    def set_description(self, text: str) -> None:
        self.what = text

    def close(self) -> None:
        self._stop.set()


def progress_bar(total: int, quiet: bool, every: float, counts=dict, stream=None):
    """What shows a run's progress on ``stream`` (stderr): a tqdm bar on a terminal with columns,
    :class:`LineProgress` otherwise (a pipe, a CI log, a terminal reporting zero columns), nothing
    with ``quiet``."""
    stream = sys.stderr if stream is None else stream
    if quiet:
        return None
    tty = hasattr(stream, "isatty") and stream.isatty()
    try:
        columns = os.get_terminal_size(stream.fileno()).columns if tty else 0
    except (OSError, ValueError, AttributeError):
        columns = 0
    if tty and columns > 0:
        try:
            from tqdm import tqdm
            return tqdm(total=total, unit="case", file=stream, leave=False, dynamic_ncols=True)
        except ImportError:
            pass
    return LineProgress(total, stream, every, counts)


# --- --json - ---------------------------------------------------------------------

@contextlib.contextmanager
def stdout_for_json(json_path: str | None):
    """With ``--json -``: yield a stream on the real stdout for the JSON and send everything
    else written to stdout (the verdict table, the summary, anything a library prints, at
    the file-descriptor level) to stderr until the end. Otherwise yield ``None``."""
    if json_path != STDOUT:
        yield None
        return
    sys.stdout.flush()
    saved = os.dup(1)
    out = os.fdopen(os.dup(saved), "w")
    os.dup2(2, 1)
    python_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        yield out
    finally:
        sys.stdout = python_stdout
        for f in (sys.stderr, python_stdout):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved, 1)
        os.close(saved)
        try:
            out.close()
        except OSError:
            pass
