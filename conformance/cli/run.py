"""``python -m conformance run``: the case table for every (runtime, world size,
implementation), the kill matrix with ``--mutants``; the verdict table, the JSON
report and the failures file."""
from __future__ import annotations

import sys
import time

from conformance.cases.scenario.dimensions import OPTIMIZER_REVEALS
from conformance.cases.row import select_rows
from conformance.cases.table import select
from conformance.errors import split_list
from conformance.evaluate import Session, evaluate, kill_rows
from conformance.impls.builtin import inherits_from
from conformance.impls.mutants.catalog import MUTANTS
from conformance.options import case_runs_at, parse_matrix, parse_model
from conformance.outcome import repro_command
from conformance.cli import RunOptions
from conformance.cli.lanes import Lanes, Unit, skip_finalization
from conformance.cli.output import progress_bar, signal_name, signal_of, signals_held, stdout_for_json
from conformance.report.coverage import coverage, unmet_requirements
from conformance.report.expected import (expected_failure_warnings, mark_expected_failures, note_inherited,
                                         read_expected_failures)
from conformance.report.findings import run_expectations
from conformance.report.text import build_json, counts, exit_code, write_json_doc
from conformance.cases.kinds import REGISTRY
from conformance.report.writers import RunOutput, run_targets, write_all
from conformance.settings import Settings
from conformance.verdict import BAD
from conformance.worlds.launched import ExternalPool, root_decides
from conformance.worlds.pool import WorldPool


# Least seconds between two progress writes of the JSON report (the first case run is always written).
PROGRESS_SECONDS = 5.0


def command(settings: Settings, options: RunOptions) -> int:
    """Run the selected cases; return the exit code (:mod:`conformance.cli`; interrupted by
    SIGINT / SIGTERM, the finished verdicts are written as a partial report marked
    ``"interrupted": true``). ``options``: the run's flags (:class:`conformance.cli.RunOptions`;
    ``user_model`` runs :mod:`conformance.cases.train.usercases` instead of the table).

    Raises:
        UsageError: bad input (the CLI prints one ``error:`` line, exit 2).
    """
    with stdout_for_json(options.json) as json_out:  # json_out: the stream of --json -, else None
        cases, targets = _select(options)
        return _Run(settings, options, json_out, cases, targets).go()


def _select(o: RunOptions) -> tuple[list, list]:
    """The cases to run (the table's, or ``--model``'s own, checked on one device before any
    world starts) and the ``(runtime, W, impls)`` targets."""
    if o.user_model:
        sizes = sorted({w for _, w, _ in parse_matrix(o.runtime, o.world_size, o.ddp, o.launcher)})
        cases, notes = parse_model(o.user_model, sizes)
        cases = select_rows(cases, split_list(o.only), split_list(o.skip))
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    else:
        cases = select(split_list(o.only), split_list(o.skip))
    return cases, parse_matrix(o.runtime, o.world_size, o.ddp, o.launcher, cases=cases)


class _Run:
    """One run: its world pool and session, what it has found so far (verdicts, kill rows,
    seconds per case run, where ``--exitfirst``/``--exitfirst-each`` stopped it, the signal
    that interrupted it) and its steps: :meth:`evaluate_in_lanes` or :meth:`evaluate_in_order`,
    :meth:`report`."""

    def __init__(self, settings: Settings, options: RunOptions, json_out, cases: list, targets: list):
        self.settings, self.o, self.json_out, self.cases, self.targets = settings, options, json_out, cases, targets
        o = options
        self.expected, self.findings = run_expectations(
            read_expected_failures(o.expected_failures) if o.expected_failures else None, o.strict_findings)
        self.pool = ExternalPool(targets[0][0], settings) if o.env_launch else WorldPool(settings)
        self.session = Session(self.pool, settings=settings)
        self.sessions = [self.session]  # one per lane (conformance.cli.lanes)
        self.by_unit = {}  # lanes: table-order index of a case run -> its verdicts
        self.lanes = None  # conformance.cli.lanes.Lanes, when the run has several
        self.verdicts, self.kills = [], []
        self.seconds = {}  # (case, impl, runtime, W) -> seconds its evaluation took (JUnit times)
        self.stopped = None  # --exitfirst: the verdict that stopped the run
        self.stopped_each = {}  # --exitfirst-each: implementation -> the verdict that stopped it
        self.interrupted = None  # the signal number that stopped the run
        self.total = sum(len(self.runs_at(rt, w, impls))
                         + (sum(1 for m in MUTANTS for c in self.cases_at(rt, w) if m in c.must_kill)
                            if o.mutants else 0)
                         for rt, w, impls in targets)
        # the backend's verdicts decide the exit code when asked, or when the backend is the subject
        self.judge_backend = o.fail_on_backend or settings.backend != "gloo"
        # a user's subclass of torch's DDP inherits torch's findings: its failures name them
        self.parents = {i: p for _, _, impls in targets for i in impls if (p := inherits_from(i))}
        self.done = 0
        self.bar = progress_bar(self.total, o.quiet or o.env_launch, settings.progress_every,
                                counts=lambda: counts(self.verdicts))
        self.root = self.pool.is_root
        self.saved_at, self.save_cost = None, 0.0

    def cases_at(self, rt, w) -> list:
        """A case runs at its own default world sizes (Case.world_sizes), unless the world size
        is given: --world-size, or the launcher's world (--launcher env)."""
        return [c for c in self.cases if case_runs_at(c, rt, w, self.o.world_size or self.o.env_launch)]

    def runs_at(self, rt, w, impls) -> list:
        """The ``(impl, case)`` runs of one target world: every case for every implementation,
        but a backend's case once (its verdicts do not depend on the DDP above it)."""
        return [(impl, c) for i, impl in enumerate(impls) for c in self.cases_at(rt, w)
                if i == 0 or REGISTRY[c.kind].subject != "backend"]

    def go(self) -> int:
        """Evaluate, then report (a partial report when a signal interrupted the run); the exit code."""
        try:
            try:  # every case of every target world and implementation, then the kill matrix
                if self.lane_count() > 1:
                    self.evaluate_in_lanes()
                else:
                    self.evaluate_in_order()
            except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM (conformance.cli.output.Interrupted)
                self.interrupted = signal_of(exc)
            if self.bar:
                self.bar.close()
            if self.interrupted:  # no broadcast: the other processes of a launched world may be gone
                with signals_held():  # a second signal must not lose the partial report
                    if self.root:
                        self.report()
                    for session in self.sessions:
                        session.close()
                print(f"interrupted by {signal_name(self.interrupted)} after {self.done} of {self.total} case runs: "
                      f"partial report {'on stdout' if self.json_out else self.o.json} (\"interrupted\": true)",
                      file=sys.stderr)
                if self.lanes:
                    skip_finalization()
                return 128 + self.interrupted
            return root_decides(self.pool, self.report)  # the same exit code on every launched process
        finally:
            if self.bar:
                self.bar.close()
            for session in self.sessions:
                session.close()

    # --- evaluate -------------------------------------------------------------------------

    def lane_count(self) -> int:
        """Lanes of this run (``Settings.lanes``, at most one per case run): one under
        ``-x`` / ``--exitfirst-each`` (the first failure is the table's first) and in a
        launcher-built world (its processes are the one world)."""
        if self.o.exitfirst or self.o.exitfirst_each or self.o.env_launch:
            return 1
        runs = sum(len(self.runs_at(rt, w, impls)) for rt, w, impls in self.targets)
        return max(1, min(self.settings.lanes, runs))

    def evaluate_in_lanes(self) -> None:
        """The case runs on :meth:`lane_count` lanes, each with its own worlds; the verdicts
        kept in table order; then the kill matrix of each target on the first lane's worlds."""
        for _ in range(self.lane_count() - 1):
            # finished runs (e.g. a collective's verdicts) and measured bounds are shared
            self.sessions.append(self.session.lane(WorldPool(self.settings)))
        units = []
        for t, (rt, w, impls) in enumerate(self.targets):
            for impl, case in self.runs_at(rt, w, impls):
                units.append(Unit(len(units), t, impl, case))

        def work(session, unit):
            rt, w, _ = self.targets[unit.target]
            return self.evaluate_case(session, unit.case, unit.impl, rt, w)

        def done(unit, got):
            self.record(got, unit.impl, unit=unit.index)

        self.lanes = Lanes(self.sessions, work, done)
        self.lanes.run(units)
        if self.o.mutants:
            for rt, w, _ in self.targets:
                self.kill_matrix(rt, w)

    def kill_matrix(self, rt: str, w: int) -> None:
        """The kill rows of every catalog mutant at ``rt`` x ``w``, one mutant at a time (an
        interrupt keeps the finished rows)."""
        for m in MUTANTS:
            self.kills += kill_rows(rt, w, self.session, mutants=[m], cases=self.cases_at(rt, w),
                                    progress=self.tick)
            self.save_progress()

    def evaluate_in_order(self) -> None:
        """Every case in table order on one lane; the next world starts while the first case
        of this one runs."""
        for t, (rt, w, impls) in enumerate(self.targets):
            later = [(rt2, w2, impls2) for rt2, w2, impls2 in self.targets[t + 1:] if self.cases_at(rt2, w2)][:1]
            prestarted = False
            for impl, case in self.runs_at(rt, w, impls):
                if self.stopped or impl in self.stopped_each:
                    continue
                got = self.evaluate_case(self.session, case, impl, rt, w)
                if later and not prestarted:  # this world is up: the next one starts meanwhile
                    self.session.prestart(*later[0])
                    prestarted = True
                self.record(got, impl)
            if self.o.mutants and not self.stopped:
                self.kill_matrix(rt, w)

    def evaluate_case(self, session, case, impl: str, rt: str, w: int) -> list:
        """One case run on ``session``'s worlds: its verdicts; its seconds kept for the JUnit times."""
        if self.bar:
            self.bar.set_description(f"{case.name} {impl} {rt} W={w}")
        t0 = time.monotonic()
        got = evaluate(case, impl, rt, w, session)
        self.seconds[(case.name, impl, rt, w)] = time.monotonic() - t0
        return got

    def record(self, got: list, impl: str, unit: int | None = None) -> None:
        """The verdicts of one case run: expected failures marked, kept (in table order:
        ``unit``, the run's index in it, when lanes finish runs out of order), counted; where
        ``--exitfirst`` / ``--exitfirst-each`` stop; the report so far saved."""
        mark_expected_failures(got, self.expected)
        if impl in self.parents:
            note_inherited(got, self.expected, self.parents[impl])
        if unit is None:
            self.verdicts += got
        else:
            self.by_unit[unit] = got
            self.verdicts = [v for i in sorted(self.by_unit) for v in self.by_unit[i]]
        self.tick()
        bad = next((v for v in got if v.status in BAD and (self.judge_backend or v.subject != "backend")), None)
        if self.o.exitfirst:
            self.stopped = bad
        elif self.o.exitfirst_each and bad:
            self.stopped_each[impl] = bad
        self.save_progress()

    def tick(self) -> None:
        self.done += 1
        if self.bar:
            self.bar.update(1)

    def world_restarts(self) -> list[str]:
        """Each world start a host's crash undid and the pool made again (``WorldPool.restarts``),
        and each world started anew because an implementation left what cannot be put back
        (``Session.fresh_worlds``)."""
        return ([line for session in self.sessions for line in session.pool.restarts]
                + [line for session in self.sessions for line in session.fresh_worlds])

    def extra(self, complete: bool) -> dict:
        """The JSON report's run keys (docs/report-format.md)."""
        out = {"cases": sorted({c.name for c in self.cases}), "profile": self.settings.profile,
               "model": self.o.user_model, "coverage": [c.to_json() for c in coverage(self.verdicts)],
               "require_supported": self.o.required,
               "optimizer_fault_kinds": OPTIMIZER_REVEALS, "complete": complete,
               "interrupted": bool(self.interrupted), "finished": {"case_runs": self.done, "of": self.total},
               "backend": {"judged": self.judge_backend, "names": sorted({v.impl for v in self.verdicts
                                                                          if v.subject == "backend"}),
                           "counts": counts([v for v in self.verdicts if v.subject == "backend"])},
               "findings": self.findings.to_json()}
        if self.interrupted:
            out["interrupted_by"] = signal_name(self.interrupted)
        if self.stopped:
            out["stopped_at"] = self.stopped.id
        if self.stopped_each:
            out["stopped_at_each"] = {impl: v.id for impl, v in self.stopped_each.items()}
        restarts = self.world_restarts()
        if restarts:
            out["world_restarts"] = restarts
        if self.o.env_launch and self.pool.world is not None:
            out["launch"] = self.pool.world.launch_info()
        return out

    def save_progress(self) -> None:
        """The report so far, ``"complete": false`` (after the first case run, then at most every
        PROGRESS_SECONDS and never more than ~10% of the run's time): a run killed by SIGKILL
        leaves its finished verdicts too, and a reader can follow the run."""
        now = time.monotonic()
        if self.json_out or not self.root or (self.saved_at is not None and now - self.saved_at
                                              < max(PROGRESS_SECONDS, 10 * self.save_cost)):
            return
        write_json_doc(self.o.json, build_json(self.verdicts, self.kills, self.extra(complete=False)))
        self.saved_at = time.monotonic()
        self.save_cost = self.saved_at - now

    # --- report ---------------------------------------------------------------------------

    def report(self) -> int:
        """Write every report, the terminal text last (:mod:`conformance.report.writers`,
        :mod:`conformance.report.terminal`); the exit code."""
        warnings = [w_ for w_ in expected_failure_warnings(self.verdicts, self.expected)  # not run is no news
                    if not (self.interrupted and w_.endswith("matches no verdict of this run"))]
        warnings += self.world_restarts()
        out = RunOutput(self.verdicts, self.kills, self.extra(complete=not self.interrupted), self.seconds,
                        signal_name(self.interrupted) if self.interrupted else None,
                        lambda v: repro_command(v, self.settings),
                        notes=self.model_bounds(), warnings=warnings)
        write_all(out, run_targets(self.o.json, self.json_out, self.o))  # the terminal prints their lines
        unmet = unmet_requirements(self.verdicts, self.o.required)
        return max(exit_code(self.verdicts, self.kills, self.judge_backend), 1 if unmet else 0)

    def model_bounds(self) -> list[str]:
        """``--model`` and ``scenario.zoo``: the bound taken from each model at each world, said once
        under the table."""
        measured = self.session.measured_tolerances
        return [f"{m} on {rt_} W={w_}: {note}"
                for m, rt_, w_, note in dict.fromkeys((k[2].model, k[0], k[1], t.note) for k, t in measured.items())]
