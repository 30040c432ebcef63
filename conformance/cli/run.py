"""``python -m conformance run``: the case table for every (runtime, world size,
implementation), the kill matrix with ``--mutants``; the verdict table, the JSON
report and the failures file."""
from __future__ import annotations

import signal
import sys
import time

from conformance.cases.scenarios.scenario import OPTIMIZER_REVEALS
from conformance.cases.row import select_rows
from conformance.cases.table import select
from conformance.errors import UsageError, split_list
from conformance.evaluate import Session, evaluate, kill_rows
from conformance.impls.mutants.catalog import MUTANTS
from conformance.options import case_runs_at, parse_matrix, parse_model
from conformance.outcome import repro_command
from conformance.cli import exitfirst_under_launcher
from conformance.cli.output import progress_bar, signal_of, signals_held, stdout_for_json
from conformance.report.causes import shared_cause
from conformance.report.coverage import coverage, unmet_requirements
from conformance.report.expected import (ExpectedFailures, expected_failure_warnings, mark_expected_failures,
                                         read_expected_failures)
from conformance.report.text import (build_json, counts, exit_code, kill_matrix_text, kill_summary,
                                     verdict_table, write_json_doc)
from conformance.report.writers import RunOutput, write_all
from conformance.settings import Settings
from conformance.verdict import BAD
from conformance.worlds.launched import ExternalPool, root_decides
from conformance.worlds.spawned import WorldPool


# Repro commands printed under the table (all of them go to the failures file).
REPRO_LINES = 5
# Least seconds between two progress writes of the JSON report (the first case run is always written).
PROGRESS_SECONDS = 5.0


def command(settings: Settings, *, runtime: str, ddp: str | None, world_size: str | None,
            only: str | None, skip: str | None, mutants: bool, expected_failures: str | None,
            quiet: bool, exitfirst: bool, exitfirst_each: bool, json: str, launcher: str,
            junitxml: str | None = None, require_supported: str | None = None, user_model: str | None = None) -> int:
    """Run the selected cases; return the exit code (0 all good, 1 a fail/vacuous verdict or a
    surviving mutant, 130 / 143 interrupted by SIGINT / SIGTERM: the finished verdicts are
    written as a partial report marked ``"interrupted": true``). ``require_supported``: a comma
    list of keywords / method names (or ``all``) whose ``unsupported`` verdicts exit 1 too.
    ``user_model``: ``package.module:factory`` of a :class:`conformance.UserModel`: run the
    cases on that model (:mod:`conformance.cases.train.usercases`) instead of the table.

    Raises:
        UsageError: bad input (the CLI prints one ``error:`` line, exit 2).
    """
    with stdout_for_json(json) as json_out:
        return _run(settings, runtime=runtime, ddp=ddp, world_size=world_size, only=only, skip=skip,
                    mutants=mutants, expected_failures=expected_failures, quiet=quiet, exitfirst=exitfirst,
                    exitfirst_each=exitfirst_each, json=json, json_out=json_out, launcher=launcher,
                    junitxml=junitxml, required=split_list(require_supported), user_model=user_model)


def _run(settings, *, runtime, ddp, world_size, only, skip, mutants, expected_failures, quiet, exitfirst,
         exitfirst_each, json, json_out, launcher, junitxml, required, user_model=None) -> int:
    if user_model:  # the user's model: its own cases, checked on one device before any world starts
        if mutants:
            raise UsageError("--model runs its own cases on your model, which no mutant row names; drop --mutants")
        sizes = sorted({w for _, w, _ in parse_matrix(runtime, world_size, ddp, launcher)})
        cases, notes = parse_model(user_model, sizes)
        cases = select_rows(cases, split_list(only), split_list(skip))
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    else:
        cases = select(split_list(only), split_list(skip))
    for flag, on in (("--exitfirst", exitfirst), ("--exitfirst-each", exitfirst_each)):
        if on and launcher == "env":
            raise UsageError(exitfirst_under_launcher(flag))
    if exitfirst and exitfirst_each:
        raise UsageError("--exitfirst stops the run, --exitfirst-each each implementation: pick one")
    targets = parse_matrix(runtime, world_size, ddp, launcher, cases=cases)

    def cases_at(rt, w):  # a case runs at its own default world sizes (Case.world_sizes), unless
        # the world size is given: --world-size, or the launcher's world (--launcher env)
        return [c for c in cases if case_runs_at(c, rt, w, world_size or launcher == "env")]
    expected = read_expected_failures(expected_failures) if expected_failures else ExpectedFailures()
    env_launch = launcher == "env"
    pool = ExternalPool(targets[0][0], settings) if env_launch else WorldPool(settings)
    session = Session(pool, settings=settings)
    verdicts, kills = [], []
    seconds = {}  # (case, impl, runtime, W) -> seconds its evaluation took (JUnit times)
    stopped = None  # --exitfirst: the verdict that stopped the run
    stopped_each = {}  # --exitfirst-each: implementation -> the verdict that stopped it
    interrupted = None  # the signal number that stopped the run
    total = sum(len(impls) * len(cases_at(rt, w))
                + (sum(1 for m in MUTANTS for c in cases_at(rt, w) if m in c.must_kill) if mutants else 0)
                for rt, w, impls in targets)
    done = [0]
    bar = progress_bar(total, quiet or env_launch, settings.progress_every, counts=lambda: counts(verdicts))
    root = getattr(pool, "is_root", True)
    saved = {"at": None, "cost": 0.0}

    def extra(complete: bool) -> dict:
        out = {"cases": sorted({c.name for c in cases}), "profile": settings.profile, "model": user_model,
               "coverage": [c.to_json() for c in coverage(verdicts)],
               "require_supported": required,
               "optimizer_fault_kinds": OPTIMIZER_REVEALS, "complete": complete,
               "interrupted": bool(interrupted), "finished": {"case_runs": done[0], "of": total}}
        if interrupted:
            out["interrupted_by"] = _signame(interrupted)
        if stopped:
            out["stopped_at"] = stopped.id
        if stopped_each:
            out["stopped_at_each"] = {impl: v.id for impl, v in stopped_each.items()}
        if env_launch and pool.world is not None:
            out["launch"] = pool.world.launch_info()
        return out

    def save_progress():
        """The report so far, ``"complete": false`` (after the first case run, then at most every
        PROGRESS_SECONDS and never more than ~10% of the run's time): a run killed by SIGKILL
        leaves its finished verdicts too, and a reader can follow the run."""
        now = time.monotonic()
        if json_out or not root or (saved["at"] is not None
                                    and now - saved["at"] < max(PROGRESS_SECONDS, 10 * saved["cost"])):
            return
        write_json_doc(json, build_json(verdicts, kills, extra(complete=False)))
        saved["at"] = time.monotonic()
        saved["cost"] = saved["at"] - now

    def tick():
        done[0] += 1
        if bar:
            bar.update(1)
    try:
        try:
            for t, (rt, w, impls) in enumerate(targets):
                later = [(rt2, w2, impls2) for rt2, w2, impls2 in targets[t + 1:] if cases_at(rt2, w2)][:1]
                prestarted = False
                for impl in impls:
                    for case in cases_at(rt, w):
                        if stopped or impl in stopped_each:
                            break
                        if bar:
                            bar.set_description(f"{case.name} {impl} {rt} W={w}")
                        t0 = time.monotonic()
                        got = evaluate(case, impl, rt, w, session)
                        seconds[(case.name, impl, rt, w)] = time.monotonic() - t0
                        if later and not prestarted:  # this world is up: the next one starts meanwhile
                            session.prestart(*later[0])
                            prestarted = True
                        mark_expected_failures(got, expected)
                        verdicts += got
                        tick()
                        bad = next((v for v in got if v.status in BAD), None)
                        if exitfirst:
                            stopped = bad
                        elif exitfirst_each and bad:
                            stopped_each[impl] = bad
                        save_progress()
                if mutants and not stopped:
                    for m in MUTANTS:  # one mutant at a time: an interrupt keeps the finished rows
                        kills += kill_rows(rt, w, session, mutants=[m], cases=cases_at(rt, w), progress=tick)
                        save_progress()
        except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (conformance.cli.output.Interrupted)
            interrupted = signal_of(exc)
        if bar:
            bar.close()

        def repro(v):
            return repro_command(v, settings)

        def report():
            warnings = [w_ for w_ in expected_failure_warnings(verdicts, expected)  # not run is no news
                        if not (interrupted and w_.endswith("matches no verdict of this run"))]
            shared = shared_cause(verdicts)  # one fault behind most failures: said first
            if shared:
                print(shared.text())
            print(verdict_table(verdicts))
            measured = getattr(session, "_measured_tolerances", {})  # --model: each bound, said once
            for rt_, w_, note in dict.fromkeys((k[0], k[1], t.note) for k, t in measured.items()):
                print(f"{user_model} on {rt_} W={w_}: {note}")
            repros = list(dict.fromkeys(repro(v) for v in verdicts if v.status in BAD))
            if repros:
                print("\nreproduce one failing case:")
                print("\n".join(f"  {c}" for c in repros[:REPRO_LINES]))
                if len(repros) > REPRO_LINES:
                    print(f"  ... {len(repros) - REPRO_LINES} more in the failures file")
            if kills:
                print("\nmutant kill matrix (every catalog mutant x every case that must kill it)")
                print(kill_matrix_text(kills))
            if stopped:
                print(f"\nstopped at the first failure (--exitfirst): {stopped.id}; later cases not run")
            for impl, v in stopped_each.items():
                print(f"\n{impl}: stopped at its first failure (--exitfirst-each): {v.id}")
            out = RunOutput(verdicts, kills, extra(complete=not interrupted), seconds,
                            _signame(interrupted) if interrupted else None, repro)
            targets = {"scenarios": json, "json": json_out or json, "failures": json}
            if junitxml:
                targets["junit"] = junitxml
            for line in write_all(out, targets):
                print(line)
            for w_ in warnings:
                print(f"warning: {w_}", file=sys.stderr)
            print(f"\nJSON report: {'stdout' if json_out else json}" + (f"; JUnit XML: {junitxml}" if junitxml else ""))
            c = counts(verdicts)
            ks = kill_summary(kills)
            print(", ".join(f"{n} {s}" for s, n in c.items() if n or s in ("pass", "fail"))
                  + (f"; mutants: {sum(r == 'killed' for r in ks.values())} killed, "
                     f"{sum(r == 'survived' for r in ks.values())} survived, "
                     f"{sum(r == 'unsupported' for r in ks.values())} unsupported" if kills else ""))
            for cov in coverage(verdicts):
                print(cov.text())
            unmet = unmet_requirements(verdicts, required)
            if unmet:
                print(f"--require-supported {','.join(required)}: {len(unmet)} verdict(s) unsupported, "
                      f"e.g. {unmet[0].id}: {unmet[0].reason.splitlines()[0] if unmet[0].reason else ''}")
            sys.stdout.flush()
            return max(exit_code(verdicts, kills), 1 if unmet else 0)
        if interrupted:  # no broadcast: the other processes of a launched world may be gone
            with signals_held():  # a second signal must not lose the partial report
                if root:
                    report()
                session.close()
            print(f"interrupted by {_signame(interrupted)} after {done[0]} of {total} case runs: partial "
                  f"report {'on stdout' if json_out else json} (\"interrupted\": true)", file=sys.stderr)
            return 128 + interrupted
        return root_decides(pool, report)  # the same exit code on every launched process
    finally:
        if bar:
            bar.close()
        session.close()


def _signame(signum: int) -> str:
    return signal.Signals(signum).name
