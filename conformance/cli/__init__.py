"""``python -m conformance``: run the case table, the mutant kill matrix, and reports.

One module per subcommand (``run``, ``repeat``, ``replay``, ``ranks``, ``calibrate``,
``report``), each a ``command(settings, **values)`` taking parsed values. This module
parses the command line and builds the :class:`~conformance.settings.Settings` before
anything imports torch, so bad input is reported at once.

Exit codes: 0 every verdict pass/unsupported/skip/xfail (and, with ``--mutants``,
every mutant killed by every case that must kill it); 1 some verdict fail or
vacuous, or a mutant survived; 2 bad input (one ``error:`` line on stderr), or
another live run writes the same ``--json`` report; 130 / 143 interrupted by SIGINT /
SIGTERM (``run`` then writes the finished verdicts as a partial report).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version as dist_version

from conformance.cli.calibrate import add_parser as add_calibrate
from conformance.cli.output import STDOUT, report_lock, signal_name, signal_of, signals_raise
from conformance.cli.report import add_parser as add_report
from conformance.cases.row import unknown_tags
from conformance.errors import UsageError, split_list
from conformance.impls.builtin import ROWS, unknown_impl
from conformance.impls.mutants.catalog import MUTANTS, unknown_mutant
from conformance.options import (check_model_spec, check_world_size_range, folder_on_path, parse_runtime_names,
                                 parse_world_sizes, runtimes_text)
from conformance.settings import PROFILES, Settings, default_help, use_hypothesis_cache
from conformance.worlds.hoststart import start_server, stop_server

# Commands that start worlds: their hosts' fork server is started first thing.
WORLD_COMMANDS = ("run", "ranks", "replay", "repeat", "calibrate")

# Options that shape the Settings rather than one command.
SETTINGS_OPTIONS = ("replica_timeout", "profile", "backend", "lanes", "topology_nodes", "topologies")


@dataclass(frozen=True)
class RunOptions:
    """The options of ``python -m conformance run``, one value (built once from the command line
    :func:`parse` checked, handed to :func:`conformance.cli.run.command`); the fields are the
    flags' values (``--help`` says what each means)."""

    runtime: str = "cpu"
    ddp: str | None = None
    world_size: str | None = None
    only: str | None = None
    skip: str | None = None
    mutants: bool = False
    expected_failures: str | None = None
    quiet: bool = False
    exitfirst: bool = False
    exitfirst_each: bool = False
    json: str = "conformance-report.json"
    launcher: str = "spawn"
    junitxml: str | None = None
    require_supported: str | None = None
    user_model: str | None = None
    fail_on_backend: bool = False
    strict_findings: bool = False

    @property
    def required(self) -> list[str]:
        """``--require-supported`` as a list (empty: none)."""
        return split_list(self.require_supported)

    @property
    def env_launch(self) -> bool:
        """This process is one replica of a world an env:// launcher started."""
        return self.launcher == "env"


class _ErrorParser(argparse.ArgumentParser):
    """argparse that reports bad input as one ``error:`` line (exit 2), no usage wall."""

    def error(self, message):
        raise UsageError(message)


def version() -> str:
    try:
        return dist_version("ddp-conformance")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser():
    p = _ErrorParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_ErrorParser)
    run = sub.add_parser("run", help="run the case table and print the verdict table")
    for add in (_add_run_selection, _add_run_execution, _add_run_output):
        add(run)
    run_actions = {a.option_strings[-1] if a.option_strings[-1].startswith("--") else a.option_strings[0]: a
                   for a in run._actions if a.option_strings}
    for add in (_add_ranks, _add_replay, _add_repeat):
        add(sub, run_actions)
    add_calibrate(sub)
    add_report(sub)
    return p


def _add_run_selection(run) -> None:
    """``run``'s options of what runs: runtimes, implementations, world sizes, the model, the
    cases, the kill matrix, and what counts as a failure."""
    run.add_argument("--runtime", default="cpu", help=f"comma list: {runtimes_text()} (default cpu)")
    run.add_argument("--ddp", help="comma list of implementations: torch, ref, all (every row that runs on the "
                     "runtime), mutant:<name>, package.module:Class (default: the runtime's)")
    run.add_argument("--world-size", help="comma list of world sizes >= 2 (default 2,3; with --launcher env the "
                     "launcher's WORLD_SIZE)")
    run.add_argument("--model", dest="user_model", metavar="MOD:FACTORY", help="run the parity, agreement and "
                     "loop-program cases on your own model instead of the case table: package.module:factory "
                     "naming a conformance.UserModel (or a zero-argument factory of one); the bound is measured on "
                     "the model (docs/configuration.md)")
    run.add_argument("--only", help="comma list of tags: run only cases carrying one (a family: parity, feature, "
                     "property, invariant, scenario; a model; a feature such as no_sync; a case name)")
    run.add_argument("--skip", help="comma list of tags: leave out cases carrying one")
    run.add_argument("--mutants", action="store_true", help="also run the kill matrix: every catalog mutant "
                     "through every selected case that must kill it")
    run.add_argument("--expected-failures", metavar="FILE", help="verdict ids (one a line, # comments) whose "
                     "failure is expected: reported xfail; ids that no longer fail or no longer exist are warned "
                     "about; a line that is no entry is an error")
    run.add_argument("--strict-findings", action="store_true", help="do not apply the kit's own findings (the "
                     "defects it measured in torch, torch_xla and gloo on the installed versions, "
                     "docs/findings.md): their verdicts fail again")
    run.add_argument("--fail-on-backend", action="store_true", help="a failing verdict of the backend beneath "
                     "the DDP (the collective family, reported apart) exits 1 too; it always does when --backend "
                     "names the backend under test")
    run.add_argument("--require-supported", metavar="LIST", help="comma list of keywords or methods "
                     "(find_unused_parameters, join, ...) or 'all': an unsupported verdict whose cause names one "
                     "exits 1 (a DDP must implement them to pass)")


def _add_run_execution(run) -> None:
    """``run``'s options of how it runs: the example budget, timeouts, the backend, lanes,
    progress, where it stops."""
    run.add_argument("--profile", help="example budget of the property and scenario cases: "
                     f"{', '.join(PROFILES)} ({default_help('profile')})")
    run.add_argument("--replica-timeout", type=float, metavar="S",
                     help=f"seconds one task may take on a world ({default_help('replica_timeout')})")
    run.add_argument("--backend", metavar="NAME|MOD:FUNC", help="torch.distributed backend of the CPU worlds: a "
                     "registered name (default gloo) or module:function registering one with "
                     "Backend.register_backend (env CONFORMANCE_BACKEND); --only collective judges its ops, the "
                     "rest of the table runs DDPs over it")
    run.add_argument("--lanes", type=int, metavar="N", help="case runs evaluated side by side, each lane with "
                     f"its own worlds ({default_help('lanes')}); 1 runs the table in order, as -x and "
                     "--exitfirst-each do")
    run.add_argument("--topology-nodes", type=int, metavar="N", help="the most hidden nodes of a module graph "
                     f"scenario.topology draws, 1 to 9 ({default_help('topology_nodes')})")
    run.add_argument("--topologies", type=int, metavar="N", help="module graphs scenario.topology draws per "
                     f"world size (0: the profile's; {default_help('topologies')}; docs/topologies.md)")
    run.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    run.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first fail or vacuous verdict "
                     "not listed in --expected-failures (exit 1; later cases are not run)")
    run.add_argument("--exitfirst-each", action="store_true", help="stop each implementation at its first fail "
                     "or vacuous verdict not listed in --expected-failures and go on with the next (a sweep over "
                     "many DDPs: one world, shared reference runs; exit 1)")


def _add_run_output(run) -> None:
    """``run``'s options of what it writes, how it is launched, and ``--repeat``."""
    run.add_argument("--json", default="conformance-report.json", metavar="PATH", help="JSON report path "
                     "(default conformance-report.json; locked for the run: a second live run on the same path "
                     "is refused); '-' writes the JSON to stdout and the human text to stderr")
    run.add_argument("--junitxml", metavar="FILE", help="also write JUnit XML: one testcase per verdict "
                     "(classname = case, name = check[impl-runtime-wW])")
    run.add_argument("--launcher", choices=("spawn", "env"), default="spawn", help="spawn: start the world's "
                     "processes here (default); env: this process is one replica of a world an env:// launcher "
                     "started (torchrun ... -m conformance run --launcher env); rank 0 prints and writes the "
                     "report")
    run.add_argument("--repeat", type=int, metavar="N",
                     help="the same as the repeat subcommand: python -m conformance repeat N")
    run.add_argument("--time-budget", type=float, metavar="S",
                     help="with --repeat: stop after S seconds (at a repetition boundary; printed)")


def _add_shared(sp, run_actions, *flags) -> None:
    """``flags`` of ``run`` (``--backend``, ``--replica-timeout``) on the subcommand ``sp``."""
    for flag in flags:
        action = run_actions[flag]
        sp.add_argument(flag, type=action.type, metavar=action.metavar, help=action.help)


def _add_ranks(sub, run_actions) -> None:
    ranks = sub.add_parser("ranks", help="print every replica's rank bindings and check the invariants")
    ranks.add_argument("--runtime", default="cpu", help=f"{runtimes_text(' or ')} (default cpu)")
    ranks.add_argument("--world-size", help="world size (default 2; with --launcher env the launcher's "
                       "WORLD_SIZE)")
    ranks.add_argument("--launcher", choices=("spawn", "env"), default="spawn", help="as for run")
    ranks.add_argument("--json", metavar="PATH",
                       help="also write the reports to this JSON file ('-': to stdout, the table to stderr)")
    _add_shared(ranks, run_actions, "--backend", "--replica-timeout")


def _add_replay(sub, run_actions) -> None:
    replay = sub.add_parser("replay", help="rerun one scenario JSON (e.g. the minimal failing one a "
                            "scenario case wrote) against implementations, or one collective draw "
                            "(the shrunk one collective.search wrote) on --backend")
    replay.add_argument("scenario", help="scenario JSON file")
    replay.add_argument("--ddp", help="comma list of implementations (default: the runtime's)")
    replay.add_argument("--runtime", default="cpu", help=f"{runtimes_text(' or ')} (default cpu)")
    replay.add_argument("--json", default="conformance-report.json", metavar="PATH",
                        help="JSON report path, as for run (default conformance-report.json; - : stdout); "
                        "failure details go to PATH with .failures.txt")
    _add_shared(replay, run_actions, "--backend", "--replica-timeout")


def _add_repeat(sub, run_actions) -> None:
    """The ``repeat`` subcommand: ``run``'s options of the cases and worlds it sweeps."""
    repeat = sub.add_parser("repeat", help="flakiness sweep: rerun the parity cases of the correct "
                            "implementations N times (seed = table seed + k)")
    repeat.add_argument("times", type=int, metavar="N", help="repetitions (>= 1)")
    for flag in ("--runtime", "--ddp", "--world-size", "--only", "--skip", "--profile", "--replica-timeout",
                 "--time-budget", "--json"):
        action = run_actions[flag]
        repeat.add_argument(flag, default=action.default, type=action.type, metavar=action.metavar,
                            help=action.help.replace("JSON report path", "JSON report path (the sweep's)"))
    _add_shared(repeat, run_actions, "--backend")


def parse(argv=None) -> tuple[str, Settings, dict]:
    """``(command, settings, values)`` of a command line.

    Raises:
        UsageError: bad input (one line).
    """
    args = build_parser().parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k != "command"}
    options = {k: values.pop(k, None) for k in SETTINGS_OPTIONS}
    command = args.command
    if command == "run" and values.get("repeat") is not None:  # run --repeat N: the repeat command
        for flag in ("mutants", "exitfirst", "exitfirst_each", "junitxml", "require_supported", "user_model"):
            if values[flag]:
                raise UsageError("--repeat reruns the table's parity cases; drop --model" if flag == "user_model"
                                 else f"--repeat reruns the correct implementations; drop --{flag.replace('_', '-')}"
                                 if flag != "junitxml" else "--junitxml: --repeat writes a sweep report, not "
                                 "verdicts; drop --junitxml")
        if values["launcher"] == "env":
            raise UsageError("--repeat runs on worlds the kit spawns; it cannot run under --launcher env")
        command, values = "repeat", {"times": values["repeat"], **{k: values[k] for k in (
            "runtime", "ddp", "world_size", "only", "skip", "time_budget", "json")}}
    elif command == "run":
        if values.pop("time_budget") is not None:
            raise UsageError("--time-budget bounds a --repeat sweep; add --repeat N")
        values.pop("repeat")
    settings = Settings.from_env(**options)
    _check_early(values)
    return command, settings, values


def _check_early(values: dict) -> None:
    """What can be checked without torch: world sizes, the selection, flags that exclude each
    other, that input files can be read (and an expected-failures file is text), and that output
    paths can be written, before the first world starts (a report is never lost at the end of a
    run)."""
    for check in (_check_sizes, _check_selection, _check_inputs, _check_outputs):
        check(values)


def _check_sizes(values: dict) -> None:
    """Runtime names and world sizes in each runtime's range."""
    runtimes = parse_runtime_names(values["runtime"]) if values.get("runtime") else []  # names only:
    # whether one runs here needs torch
    if values.get("world_size") and "model" not in values:  # calibrate takes one size, checked there
        sizes = parse_world_sizes(values["world_size"])
        for rt in runtimes:
            check_world_size_range(sizes, rt)


def _check_selection(values: dict) -> None:
    """``--model``, the ``--only`` / ``--skip`` tags, the ``--ddp`` specs and the flags that exclude
    each other or the launcher."""
    if values.get("user_model"):
        check_model_spec(values["user_model"])
        if values.get("mutants"):
            raise UsageError("--model runs its own cases (parity.user_model, parity.user_model_find_unused, "
                             "scenario.user_loop) on your model, which no mutant row names; drop --mutants")
    for opt in ("only", "skip") if not values.get("user_model") else ():  # the model's cases' tags are
        # checked when they are built
        wanted = split_list(values.get(opt))
        if wanted:
            from conformance.cases.table import all_tags  # no torch; numpy (the collective ops' table)
            unknown = [t for t in wanted if t not in all_tags()]
            if unknown:
                raise UsageError(unknown_tags(f"--{opt}", unknown))
    for spec in split_list(values.get("ddp")):
        mod_name, colon, attr = spec.partition(":")
        top = mod_name.split(".")[0]
        if not colon and spec != "all" and spec not in ROWS:
            raise UsageError(unknown_impl(spec))
        if mod_name == "mutant" and attr not in MUTANTS:
            raise UsageError(unknown_mutant(attr))
        if colon and mod_name != "mutant" and top and importlib.util.find_spec(top) is None:  # a user's
            # module that is not there at all
            raise UsageError(f"--ddp {spec!r}: cannot import {mod_name!r}: "
                             f"ModuleNotFoundError: No module named {top!r}")
    if values.get("exitfirst") and values.get("exitfirst_each"):
        raise UsageError("--exitfirst stops the run, --exitfirst-each each implementation: pick one")
    for key, flag in (("exitfirst", "--exitfirst"), ("exitfirst_each", "--exitfirst-each")):
        if values.get(key) and values.get("launcher") == "env":
            raise UsageError(f"{flag}: a launcher-built world judges on rank 0 only, so its other processes "
                             f"cannot stop together; drop {flag} or use --launcher spawn")


def _check_inputs(values: dict) -> None:
    """Input files (``--expected-failures``, a replayed scenario) can be read."""
    for key in ("expected_failures", "scenario"):
        path = values.get(key)
        flag = "--expected-failures " if key == "expected_failures" else ""
        if path and os.path.isdir(path):
            raise UsageError(f"{flag}{path}: is a folder, not a file")
        if path and not os.access(path, os.R_OK):
            raise UsageError(f"{flag}{path}: cannot read it "
                             f"({'no such file' if not os.path.exists(path) else 'permission denied'})")
    if values.get("expected_failures"):
        from conformance.report.expected import read_expected_failures
        read_expected_failures(values["expected_failures"])  # not text: one error line, not a traceback


def _check_outputs(values: dict) -> None:
    """Output paths (``--json``, ``--junitxml``) can be written, and are not the same file."""
    out = values.get("json")
    outputs = [("--json", out)] if isinstance(out, str) and values.get("calibration") is None else []
    if values.get("junitxml") is not None:
        if values["junitxml"] == STDOUT:
            raise UsageError("--junitxml -: give a file path (stdout is the verdict table, or the JSON "
                             "with --json -)")
        outputs.append(("--junitxml", values["junitxml"]))
    for flag, path in outputs:
        if flag == "--json" and path == STDOUT:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UsageError(f"{flag} {path}: folder {folder} does not exist")
        if os.path.isdir(path):
            raise UsageError(f"{flag} {path}: is a folder; give a file path")
        if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise UsageError(f"{flag} {path}: not writable")
    if len(outputs) == 2 and os.path.realpath(outputs[0][1]) == os.path.realpath(outputs[1][1]):
        raise UsageError(f"--junitxml {outputs[1][1]}: the same file as --json")


def main(argv=None) -> int:
    folder_on_path(os.getcwd())  # the ddp-conformance script does not add it, python -m does
    use_hypothesis_cache()  # before any search runs: no .hypothesis/ in the cwd
    try:
        command, settings, values = parse(argv)
        if settings.backend != "gloo":  # imports torch: a bad --backend is one error line before any world
            from conformance.worlds.runtimes.cpu import resolve_backend
            resolve_backend(settings.backend)
        if command in WORLD_COMMANDS and values.get("launcher") != "env":
            start_server(settings.host_start)  # the hosts' fork server imports torch while this process does
        with signals_raise(), report_lock(command, values):  # SIGTERM unwinds like Ctrl-C
            module = importlib.import_module(f"conformance.cli.{command}")  # imports torch
            code = (module.command(settings, RunOptions(**values)) if command == "run"  # run's options: one value
                    else module.command(settings, **values))
        if command == "run":
            from conformance.cli.lanes import end_process
            end_process(code)  # an interrupted run with lanes ends here (conformance.cli.lanes)
        return code
    except UsageError as exc:
        stop_server()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # a command that writes no partial report
        stop_server()
        sig = signal_of(exc)
        print(f"interrupted by {signal_name(sig)}", file=sys.stderr)
        return 128 + sig
