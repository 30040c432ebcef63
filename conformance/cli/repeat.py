"""``python -m conformance run --repeat N``: flakiness sweep of the correct implementations
(docs/calibration.md).

Reruns every (runtime, world size, implementation, model) of the run N times, repetition k with
the tolerance table's seed + k (k = 0 is the plain run), on the same persistent worlds; reports
every verdict that is not ``pass`` / ``unsupported`` / ``skip`` with its seed, per cell the worst
deviation and the smallest margin, and each replica host's resident set (VmRSS, MiB) when its
world started, after the first repetition and at the end (growth is a leak in the kit or the
DDP). Exit 1 when any verdict failed or was vacuous, else 0 (also when ``--time-budget`` cut the
sweep short: that is printed).
"""
from __future__ import annotations

import contextlib
import math
import sys
import time

from conformance.cli.parity import ParityRunner
from conformance.cli.output import signal_name, signal_of, signals_held, stdout_for_json
from conformance.errors import UsageError, split_list
from conformance.options import parse_matrix
from conformance.report.text import document, write_json_doc
from conformance.tolerances import lookup
from conformance.worlds.procmem import host_rss
from conformance.worlds.pool import Pool, WorldPool


class _MeteredPool(Pool):
    """A :class:`~conformance.worlds.pool.WorldPool` that reads each world's host RSS
    (:func:`conformance.worlds.procmem.host_rss`) right after the world starts."""

    def __init__(self, settings):
        self.pool, self.worlds, self.start = WorldPool(settings), {}, {}

    def get(self, key):
        runtime, world_size = key.world, key.replicas
        world = self.worlds[(runtime, world_size)] = self.pool.get(key)
        if (runtime, world_size) not in self.start:
            self.start[(runtime, world_size)] = host_rss(world)
        return world

    def read(self) -> dict:
        """``{(runtime, world_size): host_rss}`` of the worlds in use now."""
        return {key: host_rss(w) for key, w in self.worlds.items()}

    def close(self):
        self.pool.close()


def _rss_rows(start: dict, first: dict, end: dict) -> list[dict]:
    """One row per world host: RSS (MiB) at start, after repetition 1 and at the end;
    ``restarted`` when a failure replaced the world (the readings are of different processes)."""
    rows = []
    for (rt, w), hosts in start.items():
        for h in hosts:
            at = {name: next((x for x in d.get((rt, w), []) if x["host"] == h["host"]), {})
                  for name, d in (("first", first), ("end", end))}
            rows.append({"runtime": rt, "world_size": w, "host": h["host"], "pid": h["pid"],
                         "start_mib": h["rss_mib"], "after_first_mib": at["first"].get("rss_mib"),
                         "end_mib": at["end"].get("rss_mib"),
                         "restarted": any(x.get("pid") not in (None, h["pid"]) for x in at.values())})
    return rows


def _rss_text(rows: list[dict]) -> str:
    def mib(x):
        return "-" if x is None else f"{x:.1f}"

    def delta(a, b):
        return "-" if a is None or b is None else f"{b - a:+.1f}"
    if not rows:
        return "replica host RSS: no world started"
    lines = ["replica host RSS (VmRSS, MiB): world started / after repetition 1 / end "
             "(growth since start; since repetition 1)"]
    for r in rows:
        lines.append(f"  {r['runtime']} W={r['world_size']} host {r['host']} (pid {r['pid']}): "
                     f"{mib(r['start_mib'])} / {mib(r['after_first_mib'])} / {mib(r['end_mib'])} "
                     f"({delta(r['start_mib'], r['end_mib'])}; {delta(r['after_first_mib'], r['end_mib'])})"
                     + (" - world restarted during the sweep" if r["restarted"] else ""))
    return "\n".join(lines)


def command(settings, *, times: int, runtime: str, ddp: str | None, world_size: str | None,
            only: str | None, skip: str | None, time_budget: float | None, json: str) -> int:
    """``python -m conformance repeat N`` (also ``run --repeat N``): rerun the parity cases of the
    correct implementations N times (seed = table seed + k); exit 1 on any non-passing verdict."""
    n = times
    if n < 1:
        raise UsageError(f"--repeat: need N >= 1, got {n}")
    targets = parse_matrix(runtime, world_size, ddp)
    from conformance.cases.table import select
    models = [c.model for c in select(split_list(only), split_list(skip)) if c.family == "parity"]
    for _, _, impls in targets:
        for impl in impls:
            if impl.startswith("mutant:"):
                raise UsageError(f"--repeat: {impl} is a mutant; --repeat measures correct implementations")

    with stdout_for_json(json) as json_out:
        return _sweep(settings, n, targets, models, time_budget, json, json_out)


def _record(cells: dict, failures: list, where: tuple, seed: int, verdicts) -> None:
    """One training run's ``verdicts`` at ``where`` = ``(runtime, W, impl, model)`` and ``seed``
    into its cells (runs, statuses, the worst deviation and its seed) and ``failures`` (a
    non-passing verdict, printed as it comes)."""
    rt, w, impl, model = where
    for v in verdicts:
        c = cells.setdefault((rt, w, impl, model, v.check),
                             {"runtime": rt, "world_size": w, "impl": impl, "model": model, "check": v.check,
                              "runs": 0, "statuses": {}, "worst_max_dev": 0.0, "worst_seed": None,
                              "atol": v.atol})
        c["runs"] += 1
        c["statuses"][v.status] = c["statuses"].get(v.status, 0) + 1
        if math.isfinite(v.max_dev) and v.max_dev >= c["worst_max_dev"]:
            c["worst_max_dev"], c["worst_seed"] = v.max_dev, seed
        if v.status in ("fail", "vacuous"):
            failures.append(dict(v.to_json(), seed=seed))
            print(f"NOT PASSING at seed {seed}: {v.summary()}", flush=True)


def _cells_text(cells: dict) -> str:
    """The sweep's table: one row per (runtime, W, impl, model, check) cell."""
    head = ("runtime", "W", "impl", "model", "check", "runs", "statuses", "worst_dev", "seed", "min_margin")
    rows = [head] + [(c["runtime"], str(c["world_size"]), c["impl"], c["model"], c["check"], str(c["runs"]),
                      ",".join(f"{s}:{k}" for s, k in sorted(c["statuses"].items())),
                      f"{c['worst_max_dev']:.3g}", str(c["worst_seed"]),
                      "inf" if c["min_margin"] is None else f"{c['min_margin']:.3g}")
                     for c in cells.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(x.ljust(wd) for x, wd in zip(r, widths)) for r in rows)


def _ended(budget: float | None, interrupted: int | None) -> str:
    """What cut the sweep short, for its summary line: the ``--time-budget`` that stopped it or
    the signal that interrupted it (``""``: neither)."""
    return ((f" - stopped by --time-budget {budget:g} s" if budget is not None else "")
            + (f" - interrupted by {signal_name(interrupted)}" if interrupted else ""))


def _sweep(settings, n, targets, models, time_budget, json, json_out) -> int:
    """The sweep: N repetitions over the targets, then its table, the hosts' RSS, the summary
    line and the JSON report; the exit code."""
    from conformance.evaluate import Session

    pool = _MeteredPool(settings)
    runner = ParityRunner(Session(pool, settings=settings))
    interrupted = None
    rss_first, rss_end = {}, {}
    cells: dict = {}
    failures, done, runs = [], 0, 0
    t0 = time.monotonic()
    budget = time_budget
    stack = contextlib.ExitStack()  # after a signal: hold the next ones until the report is out
    try:
        try:
            for k in range(n):
                if budget is not None and done and time.monotonic() - t0 > budget:
                    break
                for rt, w, impls in targets:
                    for model in models:
                        seed = lookup(rt, model).seed + k
                        for impl in impls:
                            vs = runner.verdicts(rt, w, impl, model, seed=seed)
                            runner.forget()
                            runs += 1
                            _record(cells, failures, (rt, w, impl, model), seed, vs.values())
                done += 1
                if done == 1:
                    rss_first = pool.read()
                if done % 10 == 0 or done == n:
                    print(f"repeat {done}/{n}: {runs} runs, {len(failures)} non-passing verdicts, "
                          f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            rss_end = pool.read()
        except KeyboardInterrupt as exc:  # SIGINT / SIGTERM: report the finished repetitions
            interrupted = signal_of(exc)
            stack.enter_context(signals_held())
    finally:
        runner.close()
    wall = time.monotonic() - t0
    for c in cells.values():
        c["min_margin"] = (c["atol"] / c["worst_max_dev"]) if c["worst_max_dev"] > 0 else None
    print(_cells_text(cells))
    cut = done < n and not interrupted
    rss = _rss_rows(pool.start, rss_first, rss_end)
    print(_rss_text(rss))
    print(f"\n{done}/{n} repetitions ({runs} training runs, {sum(c['runs'] for c in cells.values())} verdicts) "
          f"in {wall:.0f} s" + _ended(budget if cut else None, interrupted)
          + f"; {len(failures)} non-passing verdict(s)" + ("" if failures else ": no flakiness seen"))
    doc = document("repeat", requested=n, completed=done, stopped_by_budget=cut, wall_seconds=round(wall, 1),
                   seeds="table seed + k, k = 0..completed-1", cells=list(cells.values()),
                   host_rss=rss, failures=failures, interrupted=bool(interrupted))
    write_json_doc(json_out or json, doc)
    print(f"JSON report: {'stdout' if json_out else json}")
    stack.close()
    if interrupted:
        print(f"interrupted by {signal_name(interrupted)} after {done} of {n} repetitions: partial "
              f"report {'on stdout' if json_out else json} (\"interrupted\": true)", file=sys.stderr)
        return 128 + interrupted
    return 1 if failures else 0
