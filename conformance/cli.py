"""``python -m conformance``: run the checks, the mutant self-test, and reports.

Exit codes: 0 every verdict pass/unsupported/skip (and every mutant killed);
1 some verdict fail/vacuous or a mutant survived; 2 bad input (one line on stderr).
"""
from __future__ import annotations

import argparse
import sys

from .tolerances import MIN_WORLD_SIZE


class UsageError(Exception):
    """Bad command-line input; ``str(exc)`` is the one line printed."""


def _split(v):
    return [x.strip() for x in v.split(",") if x.strip()]


def _parse_targets(args):
    from fixtures.models import MODELS, PARITY_MODELS

    from .impls import ImplSpecError, parse_impls
    from .runtimes import DEFAULTS, RUNTIMES, RuntimeUnavailable, get_runtime
    runtimes = _split(args.runtime)
    if not runtimes:
        raise UsageError("--runtime is empty")
    if getattr(args, "launcher", "spawn") == "env":  # the world is the launcher's processes
        from .external import EXTERNAL_RUNTIMES, LauncherEnvError, launcher_world_size
        try:
            launched = launcher_world_size()
        except LauncherEnvError as exc:
            raise UsageError(f"--launcher env: {exc}") from None
        if args.world_size is None:
            args.world_size = str(launched)
        elif _split(args.world_size) != [str(launched)]:
            raise UsageError(f"--launcher env: --world-size {args.world_size}: the launcher started "
                             f"{launched} processes (WORLD_SIZE={launched}); omit --world-size")
        for rt in runtimes:
            if rt in RUNTIMES and rt not in EXTERNAL_RUNTIMES:
                raise UsageError(f"--launcher env: runtime {rt} cannot run under an external launcher "
                                 f"(only {', '.join(EXTERNAL_RUNTIMES)})")
    try:
        sizes = [int(w) for w in _split(args.world_size or "2")]
    except ValueError:
        raise UsageError(f"--world-size: not a comma list of integers: {args.world_size!r}") from None
    if not sizes or min(sizes) < MIN_WORLD_SIZE:
        raise UsageError(f"--world-size: parity checks need world size >= {MIN_WORLD_SIZE}, got {args.world_size!r}")
    models = _split(args.models) if args.models else list(PARITY_MODELS)
    for m in models:
        if m not in MODELS:
            raise UsageError(f"--models: unknown model {m!r}; known: {', '.join(MODELS)}")
    targets = []
    for rt in runtimes:
        if rt not in RUNTIMES:
            raise UsageError(f"--runtime: unknown runtime {rt!r}; known: {', '.join(RUNTIMES)}")
        for w in sizes:
            try:
                get_runtime(rt).check(w)
            except RuntimeUnavailable as exc:
                raise UsageError(f"--runtime {rt}: {exc}") from None
        try:
            impls = [i.name for i in parse_impls(args.ddp or ",".join(DEFAULTS[rt]["impls"]))]
        except ImplSpecError as exc:
            raise UsageError(str(exc)) from None
        targets += [(rt, w, impls) for w in sizes]
    return targets, models


def cmd_run(args) -> int:
    if getattr(args, "repeat", None) is not None:  # flakiness sweep (conformance/repeat.py)
        from .repeat import cmd_repeat
        return cmd_repeat(args)
    from .mutants import PARITY_MUTANTS
    from .report import kill_matrix_text, verdict_table, write_json
    from .external import ExternalPool, root_decides
    from .rankcheck import rank_check, summary
    from .runner import Runner
    from .selftest import kill_rows
    from .world import WorldPool

    targets, models = _parse_targets(args)
    # --launcher env: this process is one replica of the world torchrun started;
    # every process runs this same code, rank 0 evaluates, prints and writes.
    env_launch = getattr(args, "launcher", "spawn") == "env"
    pool = ExternalPool(targets[0][0]) if env_launch else WorldPool()
    runner = Runner(pool)
    verdicts, kills, ranks = [], [], []
    try:
        for rt, w, impls in targets:
            if getattr(args, "ranks", False):
                ranks.append(rank_check(pool.get(rt, w)))
            for impl in impls:
                for model in models:
                    verdicts += runner.verdicts(rt, w, impl, model).values()
            if args.mutants:
                kills += kill_rows(runner, rt, w, list(PARITY_MUTANTS), models)

        def report():
            print(verdict_table(verdicts))
            from .checks import CHECKS
            if kills:
                print("\nmutant kill matrix (KILL = the check failed on some model)")
                print(kill_matrix_text(kills, list(CHECKS)))
            for check in ranks:
                print("\n" + summary(check))
            extra = {"ranks": ranks} if ranks else {}
            if env_launch and pool.world is not None:
                extra["launch"] = pool.world.launch_info()
            write_json(args.json, verdicts, kills, extra)
            print(f"\nJSON report: {args.json}")
            bad = [v for v in verdicts if v.status in ("fail", "vacuous")]
            survivors = [m for _, _, m, vs in kills if not any(v.status == "fail" for v in vs)]
            counts = {s: sum(v.status == s for v in verdicts) for s in ("pass", "fail", "vacuous", "unsupported", "skip")}
            print(", ".join(f"{n} {s}" for s, n in counts.items())
                  + (f"; {len(kills) - len(survivors)}/{len(kills)} mutants killed" if kills else "")
                  + (f"; rank invariants {'ok' if not any(c['violations'] for c in ranks) else 'VIOLATED'}"
                     if ranks else ""))
            return 1 if bad or survivors or any(c["violations"] for c in ranks) else 0
        return root_decides(pool, report)  # the same exit code on every launched process
    finally:
        runner.close()


def cmd_ranks(args) -> int:
    from .rankcheck import cmd_ranks as ranks_main
    return ranks_main(args)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m conformance", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the check table and print the verdict table")
    run.add_argument("--runtime", default="cpu", help="comma list: cpu, pjrt, xrt (default cpu)")
    run.add_argument("--ddp", default=None, help="comma list of implementations: torch, ref, "
                     "mutant:<name>, package.module:Class (default: the runtime's)")
    run.add_argument("--world-size", default=None, help="comma list of world sizes >= 2 (default 2; "
                     "with --launcher env the launcher's WORLD_SIZE)")
    run.add_argument("--models", default=None, help="comma list of models (default: all)")
    run.add_argument("--mutants", action="store_true", help="also run the mutant catalog (kill matrix)")
    run.add_argument("--json", default="conformance-report.json", help="JSON report path")
    run.add_argument("--launcher", choices=("spawn", "env"), default="spawn",
                     help="spawn: start the world's processes here (default); env: this process is one "
                     "replica of a world an env:// launcher started (torchrun ... -m conformance run "
                     "--launcher env); rank 0 prints and writes the report")
    run.add_argument("--ranks", action="store_true",
                     help="also check every world's rank bindings (invariants; reports go to the JSON)")
    run.add_argument("--repeat", type=int, default=None, metavar="N",
                     help="flakiness sweep: rerun the correct implementations N times, seed = table "
                     "seed + k (see conformance/repeat.py); exit 1 on any non-passing verdict")
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
    from .calibrate import add_parser as add_calibrate
    from .htmlreport import add_parser as add_report
    add_calibrate(sub)
    add_report(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
