"""``python -m conformance``: run the case table, the mutant kill matrix, and reports.

Exit codes: 0 every verdict pass/unsupported/skip/xfail (and, with ``--mutants``,
every mutant killed by every case that must kill it); 1 some verdict fail or
vacuous, or a mutant survived; 2 bad input (one ``error:`` line on stderr).
"""
from __future__ import annotations

import argparse
import os
import sys

from conformance.errors import UsageError, split_list


class _ErrorParser(argparse.ArgumentParser):
    """argparse that reports bad input as one ``error:`` line (exit 2), no usage wall."""

    def error(self, message):
        raise UsageError(message)


def _progress(total: int, quiet: bool):
    """A tqdm bar on stderr (off with --quiet or when stderr is not a terminal)."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="case", file=sys.stderr, leave=False, dynamic_ncols=True)


def cmd_run(args) -> int:
    if getattr(args, "repeat", None) is not None:  # flakiness sweep (conformance/cli/repeat.py)
        from conformance.cli.repeat import cmd_repeat
        return cmd_repeat(args)
    from conformance.cases.table import select
    from conformance.evaluate import Session, evaluate
    from conformance.worlds.launched import ExternalPool, root_decides
    from conformance.impls.mutants.catalog import MUTANTS
    from conformance.options import parse_targets
    from conformance.cases.properties.run import profile_examples
    from conformance.report.text import apply_expected_failures, counts, exit_code, kill_matrix_text, read_expected_failures, verdict_table, write_json
    from conformance.killmatrix import kill_rows
    from conformance.verdict import BAD
    from conformance.worlds.spawned import WorldPool

    cases = select(split_list(args.only), split_list(args.skip))
    for flag, on in (("--exitfirst", args.exitfirst), ("--exitfirst-each", args.exitfirst_each)):
        if on and args.launcher == "env":
            raise UsageError(f"{flag}: a launcher-built world judges on rank 0 only, so its other "
                             f"processes cannot stop together; drop {flag} or use --launcher spawn")
    if args.exitfirst and args.exitfirst_each:
        raise UsageError("--exitfirst stops the run, --exitfirst-each each implementation: pick one")
    targets = parse_targets(args.runtime, args.world_size, args.ddp, args.launcher)
    profile_examples(args.profile)  # validates the name
    expected = read_expected_failures(args.expected_failures) if args.expected_failures else set()
    if args.replica_timeout is not None:
        if args.replica_timeout <= 0:
            raise UsageError(f"--replica-timeout: need seconds > 0, got {args.replica_timeout:g}")
        os.environ["CONFORMANCE_TIMEOUT"] = str(args.replica_timeout)
    env_launch = args.launcher == "env"
    pool = ExternalPool(targets[0][0]) if env_launch else WorldPool()
    session = Session(pool, profile=args.profile)
    verdicts, kills = [], []
    stopped = None  # --exitfirst: the verdict that stopped the run
    stopped_each = {}  # --exitfirst-each: implementation -> the verdict that stopped it
    n_mutant = sum(1 for m in MUTANTS for c in cases if m in c.must_kill) if args.mutants else 0
    bar = _progress(sum(len(impls) * len(cases) + n_mutant for _, _, impls in targets),
                    args.quiet or env_launch)
    tick = (lambda: bar.update(1)) if bar else None
    try:
        for rt, w, impls in targets:
            for impl in impls:
                for case in cases:
                    if stopped or impl in stopped_each:
                        break
                    if bar:
                        bar.set_description(f"{case.name} {impl} {rt} W={w}")
                    got = evaluate(case, impl, rt, w, session)
                    verdicts += got
                    tick and tick()
                    bad = next((v for v in got if v.status in BAD and v.id not in expected), None)
                    if args.exitfirst:
                        stopped = bad
                    elif args.exitfirst_each and bad:
                        stopped_each[impl] = bad
            if args.mutants and not stopped:
                kills += kill_rows(rt, w, session, cases=cases, progress=tick)
        if bar:
            bar.close()

        def report():
            warnings = apply_expected_failures(verdicts, expected)
            print(verdict_table(verdicts))
            if kills:
                print("\nmutant kill matrix (every catalog mutant x every case that must kill it)")
                print(kill_matrix_text(kills))
            from conformance.cases.scenarios.scenario import OPTIMIZER_REVEALS
            extra = {"cases": sorted({c.name for c in cases}), "profile": args.profile,
                     "optimizer_fault_kinds": OPTIMIZER_REVEALS}
            if stopped:
                extra["stopped_at"] = stopped.id
                print(f"\nstopped at the first failure (--exitfirst): {stopped.id}; later cases not run")
            if stopped_each:
                extra["stopped_at_each"] = {impl: v.id for impl, v in stopped_each.items()}
                for impl, v in stopped_each.items():
                    print(f"\n{impl}: stopped at its first failure (--exitfirst-each): {v.id}")
            if env_launch and pool.world is not None:
                extra["launch"] = pool.world.launch_info()
            _write_scenarios(args.json, verdicts)
            write_json(args.json, verdicts, kills, extra)
            _write_diagnoses(args.json, verdicts + [v for k in kills for v in k.verdicts])
            for w_ in warnings:
                print(f"warning: {w_}", file=sys.stderr)
            print(f"\nJSON report: {args.json}")
            c = counts(verdicts)
            from conformance.report.text import kill_summary
            ks = kill_summary(kills)
            print(", ".join(f"{n} {s}" for s, n in c.items() if n or s in ("pass", "fail"))
                  + (f"; mutants: {sum(r == 'killed' for r in ks.values())} killed, "
                     f"{sum(r == 'SURVIVED' for r in ks.values())} survived, "
                     f"{sum(r == 'unsupported' for r in ks.values())} unsupported" if kills else ""))
            return exit_code(verdicts, kills)
        return root_decides(pool, report)  # the same exit code on every launched process
    finally:
        if bar:
            bar.close()
        session.close()


def _write_scenarios(json_path: str, verdicts) -> None:
    """The minimal failing scenario of each failing scenario case, as a replayable file."""
    import json
    done = set()
    for v in verdicts:
        if v.example is None or v.status not in ("fail", "xfail"):
            continue
        key = (v.case, v.impl, v.runtime, v.world_size)
        name = f"{v.case}-{v.impl}-{v.runtime}-w{v.world_size}".replace(":", "_").replace("/", "_")
        path = f"{os.path.splitext(json_path)[0]}.{name}.json"
        if key not in done:
            done.add(key)
            with open(path, "w") as f:
                json.dump({"case": v.case, "impl": v.impl, "runtime": v.runtime, "scenario": v.example}, f, indent=1)
            print(f"minimal failing scenario: {path}\n  reproduce: python -m conformance replay {path} "
                  f"--ddp {v.impl} --runtime {v.runtime}")
        v.diagnosis = v.diagnosis.replace("SCENARIO.json", path)


def _write_diagnoses(json_path: str, verdicts) -> None:
    """Full failure texts (replica tracebacks, stacks, counterexamples) next to the JSON."""
    failing = [v for v in verdicts if v.diagnosis and v.status in ("fail", "xfail", "vacuous")]
    path = os.path.splitext(json_path)[0] + ".failures.txt"
    if not failing:
        if os.path.exists(path):
            os.remove(path)
        return
    seen, parts = set(), []
    for v in failing:
        if (v.case, v.impl, v.runtime, v.world_size, v.diagnosis) in seen:
            continue
        seen.add((v.case, v.impl, v.runtime, v.world_size, v.diagnosis))
        parts.append(f"=== {v.id}: {v.status}: {v.reason}\n{v.diagnosis}\n")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    print(f"failure details: {path}")


def cmd_replay(args) -> int:
    """Rerun one scenario (a file written by a failing scenario case, or hand-made)."""
    from dataclasses import replace

    from conformance.cases.table import CASES
    from conformance.evaluate import Session, evaluate
    from conformance.options import parse_targets
    from conformance.report.text import exit_code, verdict_table
    from conformance.cases.scenarios.scenario import ScenarioError, load_scenario
    try:
        sc = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(f"{args.scenario}: {exc}" if not str(exc).startswith(args.scenario) else str(exc)) from None
    targets = parse_targets(args.runtime, str(sc.world_size), args.ddp)
    case = replace(CASES["scenario.core"], name="scenario.replay", description=f"replay of {args.scenario}")
    session = Session()
    try:
        verdicts = [v for rt, w, impls in targets for impl in impls
                    for v in evaluate(case, impl, rt, w, session, scenario=sc)]
    finally:
        session.close()
    print(f"scenario {args.scenario}: {len(sc.steps)} step(s), world size {sc.world_size}")
    print(verdict_table(verdicts))
    return exit_code(verdicts)


def cmd_ranks(args) -> int:
    from conformance.cli.ranks import cmd_ranks as ranks_main
    return ranks_main(args)


def build_parser():
    p = _ErrorParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_ErrorParser)
    run = sub.add_parser("run", help="run the case table and print the verdict table")
    run.add_argument("--runtime", default="cpu", help="comma list: cpu, pjrt, xrt (default cpu)")
    run.add_argument("--ddp", default=None, help="comma list of implementations: torch, ref, "
                     "all (every row that runs on the runtime), mutant:<name>, package.module:Class (default: the runtime's)")
    run.add_argument("--world-size", default=None, help="comma list of world sizes >= 2 (default 2,3; "
                     "with --launcher env the launcher's WORLD_SIZE)")
    run.add_argument("--only", default=None, help="comma list of tags: run only cases carrying one "
                     "(a family: parity, feature, property, invariant, scenario; a model; a feature "
                     "such as no_sync; a case name)")
    run.add_argument("--skip", default=None, help="comma list of tags: leave out cases carrying one")
    run.add_argument("--mutants", action="store_true", help="also run the kill matrix: every catalog "
                     "mutant through every selected case that must kill it")
    run.add_argument("--expected-failures", default=None, metavar="FILE",
                     help="verdict ids (one a line, # comments) whose failure is expected: reported "
                     "xfail; ids that no longer fail or no longer exist are warned about")
    run.add_argument("--profile", default=None, help="example budget of the property and scenario "
                     "cases: dev (default), ci, ci-pjrt, thorough (env CONFORMANCE_PROFILE)")
    run.add_argument("--replica-timeout", type=float, default=None, metavar="S",
                     help="seconds one task may take on a world (default 120; env CONFORMANCE_TIMEOUT)")
    run.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    run.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first fail or vacuous "
                     "verdict not listed in --expected-failures (exit 1; later cases are not run)")
    run.add_argument("--exitfirst-each", action="store_true", help="stop each implementation at its "
                     "first fail or vacuous verdict not listed in --expected-failures and go on with "
                     "the next (a sweep over many DDPs: one world, shared reference runs; exit 1)")
    run.add_argument("--json", default="conformance-report.json", help="JSON report path")
    run.add_argument("--launcher", choices=("spawn", "env"), default="spawn",
                     help="spawn: start the world's processes here (default); env: this process is one "
                     "replica of a world an env:// launcher started (torchrun ... -m conformance run "
                     "--launcher env); rank 0 prints and writes the report")
    run.add_argument("--repeat", type=int, default=None, metavar="N",
                     help="flakiness sweep: rerun the correct implementations N times, seed = table "
                     "seed + k (see conformance/cli/repeat.py); exit 1 on any non-passing verdict")
    run.add_argument("--time-budget", type=float, default=None, metavar="S",
                     help="with --repeat: stop after S seconds (at a repetition boundary; printed)")
    run.set_defaults(func=cmd_run)
    ranks = sub.add_parser("ranks", help="print every replica's rank bindings and check the invariants")
    ranks.add_argument("--runtime", default="cpu", help="cpu, pjrt or xrt (default cpu)")
    ranks.add_argument("--world-size", default=None, help="world size (default 2; with --launcher env "
                       "the launcher's WORLD_SIZE)")
    ranks.add_argument("--launcher", choices=("spawn", "env"), default="spawn", help="as for run")
    ranks.add_argument("--json", default=None, help="also write the reports to this JSON file")
    ranks.set_defaults(func=cmd_ranks)
    replay = sub.add_parser("replay", help="rerun one scenario JSON (e.g. the minimal failing one a "
                            "scenario case wrote) against implementations")
    replay.add_argument("scenario", help="scenario JSON file")
    replay.add_argument("--ddp", default=None, help="comma list of implementations (default: the runtime's)")
    replay.add_argument("--runtime", default="cpu", help="cpu or pjrt (default cpu)")
    replay.set_defaults(func=cmd_replay)
    from conformance.cli.calibrate import add_parser as add_calibrate
    from conformance.report.html import add_parser as add_report
    add_calibrate(sub)
    add_report(sub)
    return p


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
