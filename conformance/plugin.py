"""pytest plugin of the kit: options, session worlds, and the case table as tests.

Registered by the ``pytest11`` entry point, so it loads into every pytest session
of every project in the environment. It therefore has no side effects outside
the kit's own tests: it imports nothing heavy, registers no Hypothesis profile
and reads no Hypothesis setting (the kit's example budgets are its own, see
``--conformance-profile``), every option carries the ``--conformance-`` prefix,
and it parametrizes only tests that ask for its fixtures (``conformance_case``,
``conformance_kill``), which live in the kit's suite ``conformance/tests``. Its options: the
``conformance`` group of ``pytest --help`` (:func:`pytest_addoption`); left out, the runtime's
implementations and world sizes run on every runtime (an unavailable one skips with the reason).

Test ids read ``test_case[<case>-<impl>-<runtime>-w<W>]`` (also in JUnit XML).
"""
from __future__ import annotations

import pytest

_KILLS = pytest.StashKey[list]()
_VERDICTS = pytest.StashKey[list]()
_EXPECTED = pytest.StashKey[set]()
_SETTINGS = pytest.StashKey[object]()
_MODEL_CASES = pytest.StashKey[list]()
_RESTARTS = pytest.StashKey[list]()  # WorldPool.restarts of the session (and of xdist workers)

# Tests at this world size or above carry the `slow` marker.
SLOW_WORLD_SIZE = 8
OPTIONS = ("ddp", "runtime", "world-size", "only", "skip", "profile", "expected-failures", "timeout", "json",
           "backend", "model")


def pytest_addoption(parser):
    from conformance.options import runtimes_text
    from conformance.settings import default_help
    g = parser.getgroup("conformance", "DDP conformance kit (ddp-conformance)")
    g.addoption("--conformance-ddp", default=None, help="comma list of DDP implementations under test: "
                "torch, ref, mutant:<name>, package.module:Class")
    g.addoption("--conformance-backend", default=None, metavar="NAME|MOD:FUNC",
                help="torch.distributed backend of the CPU worlds: a name (default gloo) or module:function "
                "registering one [env CONFORMANCE_BACKEND]")
    g.addoption("--conformance-runtime", default=None, help=f"comma list of runtimes: {runtimes_text()}")
    g.addoption("--conformance-world-size", default=None, help="comma list of world sizes (>= 2)")
    g.addoption("--conformance-only", default=None, help="comma list of tags: only cases carrying one")
    g.addoption("--conformance-skip", default=None, help="comma list of tags: leave out cases carrying one")
    g.addoption("--conformance-profile", default=None,
                help="example budget of property cases: dev, ci, ci-pjrt, thorough")
    g.addoption("--conformance-expected-failures", default=None, metavar="FILE",
                help="verdicts whose failure is expected (reported xfail): one a line, a case, "
                "case:check, verdict id or a * pattern over ids")
    g.addoption("--conformance-strict-findings", action="store_true",
                help="do not apply the kit's own findings in torch, torch_xla and gloo (docs/findings.md)")
    g.addoption("--conformance-mutants", action="store_true",
                help="run the mutant kill matrix also when --conformance-ddp names implementations")
    g.addoption("--conformance-timeout", type=float, default=None,
                help=f"seconds one task may take on a world ({default_help('replica_timeout')})")
    g.addoption("--conformance-json", default=None, metavar="PATH",
                help="write the verdicts and the kill matrix as the run JSON report")
    g.addoption("--conformance-model", default=None, metavar="MOD:FACTORY",
                help="run the parity, agreement and loop-program cases on your own model: package.module:factory naming a "
                "conformance.UserModel (or a zero-argument factory of one); the bound is measured on it")


def _opt(config, name):
    return config.getoption("--conformance-" + name, None)


def _usage(fn, *a):
    from conformance.errors import UsageError
    try:
        return fn(*a)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config):
    config.stash[_KILLS], config.stash[_VERDICTS], config.stash[_EXPECTED] = [], [], set()
    if not any(_opt(config, o) for o in OPTIONS):
        return  # nothing of ours was asked for: validate nothing, import nothing
    from conformance.options import parse_impl_names, parse_runtimes, parse_world_sizes
    from conformance.cases.property.kind import profile_examples
    ws = _opt(config, "world-size")
    sizes = _usage(parse_world_sizes, ws) if ws else []
    rts = _usage(parse_runtimes, _opt(config, "runtime"), sizes) if _opt(config, "runtime") else []
    if _opt(config, "ddp"):
        _invocation_dir_on_path(config)
        for rt in rts or ["cpu"]:
            _usage(parse_impl_names, _opt(config, "ddp"), rt)
    if _opt(config, "model"):  # the user's model: checked on one device now, its cases replace the table's
        from conformance.options import parse_model
        from conformance.settings import default_world_sizes
        _invocation_dir_on_path(config)
        every = sizes or sorted({w for rt in rts or ["cpu"] for w in default_world_sizes(rt)})
        cases, _ = _usage(parse_model, _opt(config, "model"), every, "--conformance-model")
        config.stash[_MODEL_CASES] = cases
    if _opt(config, "only") or _opt(config, "skip"):
        _usage(selected_cases, config)
    _usage(profile_examples, _opt(config, "profile"))
    from conformance.report.expected import read_expected_failures
    from conformance.report.findings import run_expectations
    user = _usage(read_expected_failures, _opt(config, "expected-failures")) if _opt(config, "expected-failures") else None
    config.stash[_EXPECTED] = run_expectations(user, config.getoption("--conformance-strict-findings"))[0]
    config.stash[_SETTINGS] = _usage(settings_of, config)
    if _opt(config, "backend"):
        from conformance.worlds.runtimes.cpu import resolve_backend
        _invocation_dir_on_path(config)
        _usage(resolve_backend, config.stash[_SETTINGS].backend)


def _invocation_dir_on_path(config):
    """``package.module:Class`` specs resolve against the folder pytest was started in, as with
    ``python -m pytest`` and ``python -m conformance run`` (the ``pytest`` script alone does not
    put it on ``sys.path``)."""
    from conformance.options import folder_on_path
    folder_on_path(str(config.invocation_params.dir))


def settings_of(config):
    """The run's :class:`~conformance.settings.Settings`: the environment, then the options."""
    from conformance.settings import Settings
    return Settings.from_env(replica_timeout=_opt(config, "timeout"), profile=_opt(config, "profile"),
                             backend=_opt(config, "backend"))


def runtime_worlds(config):
    """``[(runtime, world_size, marks)]`` to generate tests for: the worlds
    :func:`conformance.options.world_matrix` gives every face (the CLI's too), over every
    runtime unless ``--conformance-runtime`` names some."""
    from conformance.errors import split_list
    from conformance.options import world_matrix
    from conformance.worlds.runtimes import RUNTIMES
    rt = _opt(config, "runtime")
    names = split_list(rt) if rt else list(RUNTIMES)
    return [(name, w, [getattr(pytest.mark, name)] + ([pytest.mark.slow] if w >= SLOW_WORLD_SIZE else []))
            for name, w in world_matrix(names, _opt(config, "world-size"), selected_cases(config))]


def impls_for(config, runtime):
    from conformance.impls.builtin import parse_impls
    from conformance.settings import default_impls
    ddp = _opt(config, "ddp")
    return [i.name for i in parse_impls(ddp, runtime)] if ddp else list(default_impls(runtime))


def selected_cases(config):
    from conformance.cases.row import select_rows
    from conformance.cases.table import CASES
    from conformance.errors import split_list
    stash = getattr(config, "stash", None)  # --conformance-model: the model's cases (pytest_configure)
    rows = (stash.get(_MODEL_CASES, None) if stash is not None else None) or CASES.values()
    return select_rows(rows, split_list(_opt(config, "only")), split_list(_opt(config, "skip")))


@pytest.hookimpl(trylast=True)  # after @pytest.mark.parametrize: its ids come first
def pytest_generate_tests(metafunc):
    """Parametrize the kit's own tests: ``conformance_case`` (case x impl x runtime x W)
    and ``conformance_kill`` (mutant x case that must kill it x runtime x W)."""
    names, config = metafunc.fixturenames, metafunc.config
    if "conformance_case" not in names and "conformance_kill" not in names:
        return  # another project's test: import nothing
    from conformance.options import case_runs_at
    sizes = _opt(config, "world-size")  # given: every case runs at them; else each at its own
    if "conformance_case" in names:
        from conformance.cases.kinds import REGISTRY
        # a backend's case once per world: its verdicts do not depend on the DDP above it
        params = [pytest.param((case, impl, rt, w), marks=marks,
                               id=f"{case.name}-{'backend' if backend else impl}-{rt}-w{w}")
                  for rt, w, marks in runtime_worlds(config) for i, impl in enumerate(impls_for(config, rt))
                  for case in selected_cases(config)
                  for backend in [REGISTRY[case.kind].subject == "backend"]
                  if case_runs_at(case, rt, w, sizes) and (i == 0 or not backend)]
        metafunc.parametrize("conformance_case", params)
    else:
        params = []
        if (not _opt(config, "ddp") or _opt(config, "mutants")) and not _opt(config, "model"):
            from conformance.impls.mutants.catalog import MUTANTS
            cases = selected_cases(config)
            params = [pytest.param((m, case, rt, w), marks=marks, id=f"{m}-{case.name}-{rt}-w{w}")
                      for rt, w, marks in runtime_worlds(config) for m in MUTANTS
                      for case in cases if m in case.must_kill and case_runs_at(case, rt, w, sizes)]
        metafunc.parametrize("conformance_kill", params)


@pytest.fixture(scope="session")
def conformance_world_pool(request):
    """The session's persistent worlds (a :class:`conformance.worlds.pool.WorldPool`:
    ``get(WorldKey(runtime, world_size))``), closed at the end."""
    from conformance.worlds.pool import WorldPool
    pool = WorldPool(request.config.stash.get(_SETTINGS, None) or settings_of(request.config),
                     restarts=request.config.stash.setdefault(_RESTARTS, []))  # said in the terminal summary
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def conformance_session(conformance_world_pool, request):
    from conformance.evaluate import Session
    return Session(conformance_world_pool, settings=conformance_world_pool.settings)


@pytest.fixture
def conformance_log(request):
    """``(verdicts, kill_rows)`` lists of the session (``--conformance-json``, the summary)."""
    return request.config.stash[_VERDICTS], request.config.stash[_KILLS]


@pytest.fixture
def conformance_expected(request):
    return request.config.stash[_EXPECTED]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist controller: merge a finished worker's verdicts and kill rows."""
    from conformance.report.kills import KillRow
    from conformance.verdict import Verdict
    got = getattr(node, "workeroutput", {}).get("conformance")
    if not got:
        return
    node.config.stash.setdefault(_VERDICTS, []).extend(Verdict.from_json(v) for v in got["verdicts"])
    node.config.stash.setdefault(_KILLS, []).extend(KillRow.from_json(k) for k in got["kills"])
    node.config.stash.setdefault(_RESTARTS, []).extend(got.get("restarts", []))


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    verdicts, kills = config.stash.get(_VERDICTS, []), config.stash.get(_KILLS, [])
    if hasattr(config, "workerinput"):  # pytest-xdist worker: hand everything to the controller
        config.workeroutput["conformance"] = {"verdicts": [v.to_json() for v in verdicts],
                                              "kills": [k.to_json() for k in kills],
                                              "restarts": list(config.stash.get(_RESTARTS, []))}
        return
    path = _opt(config, "json")
    if not path:
        return
    from conformance.report.writers import RunOutput, write_all  # the writers of run and report
    write_all(RunOutput(verdicts, kills, {"source": "pytest", "pytest": {
        "exitstatus": int(exitstatus), "args": list(config.invocation_params.args)}}), {"json": path})


def pytest_terminal_summary(terminalreporter, config):
    verdicts, kills = config.stash.get(_VERDICTS, []), config.stash.get(_KILLS, [])
    expected = config.stash.get(_EXPECTED, None)
    if not hasattr(config, "workerinput"):  # the controller: over the whole session
        sections = [("conformance worlds", config.stash.get(_RESTARTS, []))]
        if expected:
            from conformance.report.expected import expected_failure_warnings
            sections.insert(0, ("conformance expected failures", expected_failure_warnings(verdicts, expected)))
        for section, warnings in sections:
            if warnings:
                terminalreporter.section(section)
                for text in warnings:
                    terminalreporter.write_line(f"warning: {text}")
    if _opt(config, "json"):
        terminalreporter.write_line(f"conformance JSON report: {_opt(config, 'json')} ({len(verdicts)} "
                                    f"verdicts, {len(kills)} kill-matrix cells)")
    if kills:
        from conformance.report.text import kill_matrix_text
        terminalreporter.section("mutant kill matrix")
        terminalreporter.write_line(kill_matrix_text(kills))
