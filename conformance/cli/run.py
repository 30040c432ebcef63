"""``python -m conformance run``: the case table for every (runtime, world size,
implementation), the kill matrix with ``--mutants``; the verdict table, the JSON
report and the failures file."""
from __future__ import annotations

import json as _json
import os
import sys

from conformance.cases.scenarios.scenario import OPTIMIZER_REVEALS
from conformance.cases.table import select
from conformance.errors import UsageError, split_list
from conformance.evaluate import Session, evaluate, kill_rows
from conformance.impls.mutants.catalog import MUTANTS
from conformance.options import parse_matrix
from conformance.outcome import repro_command
from conformance.report.text import (apply_expected_failures, counts, exit_code, kill_matrix_text,
                                     kill_summary, read_expected_failures, verdict_table, write_json)
from conformance.settings import Settings
from conformance.verdict import BAD
from conformance.worlds.launched import ExternalPool, root_decides
from conformance.worlds.spawned import WorldPool


# Repro commands printed under the table (all of them go to the failures file).
REPRO_LINES = 5


def command(settings: Settings, *, runtime: str, ddp: str | None, world_size: str | None,
            only: str | None, skip: str | None, mutants: bool, expected_failures: str | None,
            quiet: bool, exitfirst: bool, exitfirst_each: bool, json: str, launcher: str) -> int:
    """Run the selected cases; return the exit code (0 all good, 1 a fail/vacuous verdict or a
    surviving mutant).

    Raises:
        UsageError: bad input (the CLI prints one ``error:`` line, exit 2).
    """
    cases = select(split_list(only), split_list(skip))
    for flag, on in (("--exitfirst", exitfirst), ("--exitfirst-each", exitfirst_each)):
        if on and launcher == "env":
            raise UsageError(f"{flag}: a launcher-built world judges on rank 0 only, so its other "
                             f"processes cannot stop together; drop {flag} or use --launcher spawn")
    if exitfirst and exitfirst_each:
        raise UsageError("--exitfirst stops the run, --exitfirst-each each implementation: pick one")
    targets = parse_matrix(runtime, world_size, ddp, launcher)
    expected = read_expected_failures(expected_failures) if expected_failures else set()
    env_launch = launcher == "env"
    pool = ExternalPool(targets[0][0], settings) if env_launch else WorldPool(settings)
    session = Session(pool, settings=settings)
    verdicts, kills = [], []
    stopped = None  # --exitfirst: the verdict that stopped the run
    stopped_each = {}  # --exitfirst-each: implementation -> the verdict that stopped it
    n_mutant = sum(1 for m in MUTANTS for c in cases if m in c.must_kill) if mutants else 0
    bar = _progress(sum(len(impls) * len(cases) + n_mutant for _, _, impls in targets),
                    quiet or env_launch)
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
                    if exitfirst:
                        stopped = bad
                    elif exitfirst_each and bad:
                        stopped_each[impl] = bad
            if mutants and not stopped:
                kills += kill_rows(rt, w, session, cases=cases, progress=tick)
        if bar:
            bar.close()

        def report():
            warnings = apply_expected_failures(verdicts, expected)
            print(verdict_table(verdicts))
            repros = list(dict.fromkeys(repro_command(v) for v in verdicts if v.status in BAD))
            if repros:
                print("\nreproduce one failing case:")
                print("\n".join(f"  {c}" for c in repros[:REPRO_LINES]))
                if len(repros) > REPRO_LINES:
                    print(f"  ... {len(repros) - REPRO_LINES} more in the failures file")
            if kills:
                print("\nmutant kill matrix (every catalog mutant x every case that must kill it)")
                print(kill_matrix_text(kills))
            extra = {"cases": sorted({c.name for c in cases}), "profile": settings.profile,
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
            _write_scenarios(json, verdicts)
            write_json(json, verdicts, kills, extra)
            _write_diagnoses(json, verdicts + [v for k in kills for v in k.verdicts])
            for w_ in warnings:
                print(f"warning: {w_}", file=sys.stderr)
            print(f"\nJSON report: {json}")
            c = counts(verdicts)
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



def _progress(total: int, quiet: bool):
    """A tqdm bar on stderr (off with --quiet or when stderr is not a terminal)."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="case", file=sys.stderr, leave=False, dynamic_ncols=True)


def _write_scenarios(json_path: str, verdicts) -> None:
    """The minimal failing scenario of each failing scenario case, as a replayable file."""
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
                _json.dump({"case": v.case, "impl": v.impl, "runtime": v.runtime, "scenario": v.example}, f, indent=1)
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
        parts.append(f"=== {v.id}: {v.status}: {v.reason}\nreproduce: {repro_command(v)}\n{v.diagnosis}\n")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    print(f"failure details: {path}")
