"""pytest plugin of the kit: options, markers, session worlds, parametrization.

Registered by the ``pytest11`` entry point (so ``pytest --pyargs conformance``
works from any directory once the kit is installed) and by the repository's
root ``conftest.py``.

Options:
    --runtime       comma list of runtimes to generate tests for (default: all;
                    use ``-m`` to select). Naming a runtime that cannot run here
                    is a usage error; unnamed unavailable runtimes are skipped
                    with the reason.
    --ddp           comma list of implementations under test (``torch``, ``ref``,
                    ``mutant:<name>``, ``package.module:Class``); default per
                    runtime (see ``conformance.runtimes.DEFAULTS``).
    --world-size    comma list of world sizes (>= 2); default per runtime.
    --replica-timeout  seconds a task may take on a world (default 120).
    --conformance-json PATH  after the session, write the run's JSON report
                    (the format of ``python -m conformance run --json``:
                    ``verdicts`` of test_parity/test_features, ``kill_matrix``
                    of the mutant tests, each verdict with ``per_step``) plus a
                    ``pytest`` section; ``python -m conformance report`` reads
                    it. Works under pytest-xdist (``-n``): every worker sends
                    its verdicts to the controller (``workeroutput``), which
                    writes one file; order then follows test completion.

Test ids read ``check[impl-runtime-model]``-style: the test's own parameters
first, then implementation, runtime and world size, e.g.
``test_check[param_parity-linear-torch-cpu-w2]`` (also the JUnit XML names of
``--junitxml``).

Hypothesis profiles (property checks, ``conformance/tests/test_properties.py``):
``ci`` (derandomized, 200 examples per property, no database), ``dev`` (25
examples; the default), ``thorough`` (2000). Select one with Hypothesis' own
``--hypothesis-profile`` option (wins) or env ``HYPOTHESIS_PROFILE`` (tox sets
``ci``). ``dev``/``thorough`` keep their example database under
``$XDG_CACHE_HOME/ddp-conformance/hypothesis`` (default ``~/.cache``), never in
the repository.
"""
from __future__ import annotations

import os

import pytest

from .checks import CHECKS
from .impls import ImplSpecError, parse_impls
from .runtimes import DEFAULTS, RUNTIMES, RuntimeUnavailable, get_runtime
from .tolerances import MIN_WORLD_SIZE

_KILLS = pytest.StashKey[list]()
_VERDICTS = pytest.StashKey[list]()


def _hypothesis_profiles() -> str | None:
    """Register the kit's Hypothesis profiles and load the one env
    ``HYPOTHESIS_PROFILE`` names (else ``dev``, unless Hypothesis already
    loaded its CI profile). Runs at import, before Hypothesis' own pytest plugin
    applies ``--hypothesis-profile``. Returns a usage error text or None."""
    try:
        from hypothesis import HealthCheck, settings
        from hypothesis.database import DirectoryBasedExampleDatabase
        from hypothesis.errors import InvalidArgument
    except ImportError:  # the test extra is not installed: no property tests
        return None
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    db = DirectoryBasedExampleDatabase(os.path.join(cache, "ddp-conformance", "hypothesis"))
    common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.register_profile("ci", max_examples=200, derandomize=True, database=None,
                              print_blob=True, **common)
    # PJRT recompiles for every new tensor shape: 200 examples per property cost
    # ~19 min there on 2 cores, so CI's pjrt env runs 50 (derandomized likewise).
    settings.register_profile("ci-pjrt", max_examples=50, derandomize=True, database=None,
                              print_blob=True, **common)
    settings.register_profile("dev", max_examples=25, database=db, **common)
    settings.register_profile("thorough", max_examples=2000, database=db, **common)
    name = os.environ.get("HYPOTHESIS_PROFILE")
    try:
        if name:
            settings.load_profile(name)
        elif settings.get_current_profile_name() == "default":
            settings.load_profile("dev")
    except InvalidArgument:
        return f"HYPOTHESIS_PROFILE={name!r}: unknown profile; the kit registers ci, ci-pjrt, dev, thorough"
    return None


_HYPOTHESIS_PROFILE_ERROR = _hypothesis_profiles()


def pytest_addoption(parser):
    g = parser.getgroup("conformance", "DDP conformance kit")
    g.addoption("--runtime", default=None, help="comma list of runtimes: " + ", ".join(RUNTIMES))
    g.addoption("--ddp", default=None, help="comma list of DDP implementations under test")
    g.addoption("--world-size", default=None, help="comma list of world sizes (>= 2)")
    g.addoption("--replica-timeout", type=float, default=None,
                help="seconds one task may take on a world (default 120)")
    g.addoption("--conformance-json", default=None, metavar="PATH",
                help="write the verdicts and the kill matrix as the run JSON report "
                "(python -m conformance report --json PATH renders it)")


def pytest_configure(config):
    for name, text in [("cpu", "runs on the CPU runtime (gloo)"),
                       ("pjrt", "runs on the PJRT runtime (torch_xla)"),
                       ("xrt", "XRT runtime (legacy torch_xla <= 2.0)"),
                       ("slow", "long-running (large world sizes)")]:
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_KILLS] = []
    config.stash[_VERDICTS] = []
    _validate(config)


def _split(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def _validate(config):
    """Turn bad options into one-line usage errors (pytest exits with code 4)."""
    if _HYPOTHESIS_PROFILE_ERROR:
        raise pytest.UsageError(_HYPOTHESIS_PROFILE_ERROR)
    rt = config.getoption("--runtime")
    if rt is not None:
        for name in _split(rt):
            if name not in RUNTIMES:
                raise pytest.UsageError(f"--runtime: unknown runtime {name!r}; known: {', '.join(RUNTIMES)}")
            try:
                get_runtime(name).check(MIN_WORLD_SIZE)
            except RuntimeUnavailable as exc:
                raise pytest.UsageError(f"--runtime {name}: {exc}") from None
    ws = config.getoption("--world-size")
    if ws is not None:
        try:
            sizes = [int(w) for w in _split(ws)]
        except ValueError:
            raise pytest.UsageError(f"--world-size: not a comma list of integers: {ws!r}") from None
        if not sizes or min(sizes) < MIN_WORLD_SIZE:
            raise pytest.UsageError(f"--world-size: parity checks need world size >= {MIN_WORLD_SIZE}, got {ws!r}")
        for name in _split(rt) if rt else []:
            for w in sizes:
                try:
                    get_runtime(name).check(w)
                except RuntimeUnavailable as exc:
                    raise pytest.UsageError(f"--world-size {w}: {exc}") from None
    ddp = config.getoption("--ddp")
    if ddp is not None:
        try:
            parse_impls(ddp)
        except ImplSpecError as exc:
            raise pytest.UsageError(str(exc)) from None
    if config.getoption("--replica-timeout"):
        os.environ["CONFORMANCE_TIMEOUT"] = str(config.getoption("--replica-timeout"))


def runtime_worlds(config):
    """``[(runtime, world_size, marks)]`` to generate tests for."""
    rt = config.getoption("--runtime")
    ws = config.getoption("--world-size")
    out = []
    for name in (_split(rt) if rt else list(RUNTIMES)):
        d = DEFAULTS[name]
        sizes = [(int(w), False) for w in _split(ws)] if ws else (
            [(w, False) for w in d["world_sizes"]] + [(w, True) for w in d.get("slow_world_sizes", ())])
        for w, slow in sizes:
            marks = [getattr(pytest.mark, name)] + ([pytest.mark.slow] if slow else [])
            out.append((name, w, marks))
    return out


def impls_for(config, runtime):
    ddp = config.getoption("--ddp")
    return _split(ddp) if ddp else list(DEFAULTS[runtime]["impls"])


@pytest.hookimpl(trylast=True)  # after @pytest.mark.parametrize: its ids come first
def pytest_generate_tests(metafunc):
    """Parametrize tests that ask for ``runtime_world`` (and ``impl``)."""
    names = metafunc.fixturenames
    if "runtime_world" not in names:
        return
    with_impl = "impl" in names
    params = []
    for runtime, w, marks in runtime_worlds(metafunc.config):
        if with_impl:
            params += [pytest.param((runtime, w), impl, marks=marks, id=f"{impl}-{runtime}-w{w}")
                       for impl in impls_for(metafunc.config, runtime)]
        else:
            params.append(pytest.param((runtime, w), marks=marks, id=f"{runtime}-w{w}"))
    metafunc.parametrize("runtime_world,impl" if with_impl else "runtime_world", params)


@pytest.fixture(scope="session")
def world_pool():
    from .world import WorldPool
    pool = WorldPool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def runner(world_pool):
    from .runner import Runner
    return Runner(world_pool)


@pytest.fixture
def world(runtime_world, world_pool):
    """The session's persistent world for this test's (runtime, world size); skips
    with the runtime's reason when it cannot run here."""
    runtime, w = runtime_world
    try:
        get_runtime(runtime).check(w)
    except RuntimeUnavailable as exc:
        pytest.skip(f"unsupported: {exc}")
    return world_pool.get(runtime, w)


@pytest.fixture
def kill_log(request):
    """List the mutant tests append ``(runtime, world_size, mutant, verdicts)`` to."""
    return request.config.stash[_KILLS]


@pytest.fixture
def verdict_log(request):
    """List the check tests append their :class:`~conformance.checks.Verdict` s to
    (written by ``--conformance-json``)."""
    return request.config.stash[_VERDICTS]


def _collected_json(config) -> dict:
    return {"verdicts": [v.to_json() for v in config.stash.get(_VERDICTS, [])],
            "kills": [[r, w, m, [v.to_json() for v in vs]] for r, w, m, vs in config.stash.get(_KILLS, [])]}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist controller: merge a finished worker's verdicts and kill rows."""
    from .report import verdict_from_json
    got = getattr(node, "workeroutput", {}).get("conformance")
    if not got:
        return
    config = node.config
    config.stash.setdefault(_VERDICTS, []).extend(verdict_from_json(v) for v in got["verdicts"])
    config.stash.setdefault(_KILLS, []).extend(
        (r, w, m, [verdict_from_json(v) for v in vs]) for r, w, m, vs in got["kills"])


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if hasattr(config, "workerinput"):  # pytest-xdist worker: hand everything to the controller
        config.workeroutput["conformance"] = _collected_json(config)
        return
    path = config.getoption("--conformance-json", None)
    if not path:
        return
    from .report import write_json
    write_json(path, config.stash.get(_VERDICTS, []), config.stash.get(_KILLS, []),
               {"source": "pytest", "pytest": {"exitstatus": int(exitstatus),
                                               "args": list(config.invocation_params.args)}})


def pytest_terminal_summary(terminalreporter, config):
    if config.getoption("--conformance-json", None):
        terminalreporter.write_line(f"conformance JSON report: {config.getoption('--conformance-json')} "
                                    f"({len(config.stash.get(_VERDICTS, []))} verdicts, "
                                    f"{len(config.stash.get(_KILLS, []))} mutant rows)")
    rows = config.stash.get(_KILLS, [])
    if not rows:
        return
    from .report import kill_matrix_text
    terminalreporter.section("mutant kill matrix")
    names = list(CHECKS) + sorted({v.check.split(".")[-1] for *_, vs in rows for v in vs} - set(CHECKS))
    terminalreporter.write_line(kill_matrix_text(rows, names))
