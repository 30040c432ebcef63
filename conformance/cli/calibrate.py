"""``python -m conformance calibrate``: measure where a tolerance row sits between
the noise of correct runs and the signal of the mutant catalog.

For one (runtime, world size, model, correct implementation) it runs, with the
same evaluation as ``run`` (:func:`conformance.evaluate.evaluate` on the ``parity.<model>`` case, a
:class:`~conformance.cases.shared.loop.RunSpec` whose ``seed`` is overridden):

* the correct implementation over ``N`` seeds (``table seed + k``, k < N), and
* every mutant of the parity catalog (``must_kill`` of the parity cases)
  over the same seeds,

and records every applicable check's per-step deviation from the single-device
reference (:attr:`Verdict.per_step`; ``param_parity``'s is the per-step max
parameter deviation).

Definitions (all deviations are expressed on the scale of the row's parameter
``atol``: a check whose bound is another number - ``loss_parity`` uses
``loss_atol`` - has its deviation multiplied by ``atol / its bound``, so a value
is "too large" exactly when it exceeds ``atol``; for every float32 row of the
table ``loss_atol == atol`` and the values are the raw deviations):

``noise``
    the largest deviation of a correct run: max over seeds, over applicable
    checks, over steps. Every correct run must also ``pass``.
``signal``
    for one mutant on one seed, ``s(m, seed)`` = the largest deviation among the
    checks that kill it (status ``fail``) on that seed - or, if none kills it
    there, the largest over all applicable checks (then below ``atol``, which
    fails the gate). A mutant's signal is its weakest non-silent seed,
    ``s(m) = min over seeds of s(m, seed)``; the table's signal is the weakest
    visible mutant, ``signal = min over visible m of s(m)``.
``silent`` seed
    a (mutant, seed) run that no check kills and whose every check deviates by at
    most ``SILENT_FACTOR`` (2) x the noise floor: the mutation did not change the
    run (``clip_local_grad`` when no local gradient norm exceeds the clip; the
    factor absorbs the reduction-order rounding by which two correct
    implementations differ). It carries no signal - no tolerance could see it -
    so it is left out of ``s(m)`` and listed.
``excluded``
    a mutant that cannot be seen on the model is left out of ``signal`` and
    listed with the reason: (a) the case table does not require the model's
    parity case to kill it (its ``must_kill``: ``buffers_not_broadcast`` on a
    model without buffers), or (b) it is silent at every seed - the model does
    not exercise the mutation. A mutant whose deviation is above the noise but below
    ``atol`` is *not* excluded: that is exactly what calibration must flag.

The row is well placed when ``atol >= 10 * noise``, ``atol <= signal / 10`` and
``signal / noise >= 100``; otherwise the command exits 1 and names the failed
condition. Exit 2 on bad input, as ``run``.
"""
from __future__ import annotations

import math
import time

from conformance.cli.parity import ParityRunner, parity_mutants
from conformance.options import parse_calibration
from conformance.report.text import document, write_json_doc
from conformance.tolerances import MIN_SIDE_FACTOR, lookup
from conformance.worlds.pool import WorldPool

MIN_SIGNAL_TO_NOISE = 100.0
SILENT_FACTOR = 2.0        # a mutant run within 2 x noise on every check did not trigger
DEFAULT_SEEDS = 5


def _scaled(verdict, atol: float) -> float:
    """The max deviation of ``verdict`` on the scale of ``atol``."""
    k = atol / verdict.atol if verdict.atol and math.isfinite(verdict.atol) and verdict.atol > 0 else 1.0
    return verdict.max_dev * k if math.isfinite(verdict.max_dev) else float("inf")


def _checks_json(verdicts: dict) -> dict:
    return {n: {"status": v.status, "max_dev": _num(v.max_dev), "atol": _num(v.atol),
                "per_step": [_num(x) for x in v.per_step], "reason": v.reason}
            for n, v in verdicts.items()}


def _num(x):
    return None if x is None or not math.isfinite(x) else float(x)


def calibrate(runner, runtime: str, world_size: int, model: str, impl: str, seeds: list[int],
              dtype: str = "float32", progress=None, memo: dict | None = None) -> dict:
    """Run the calibration of one (runtime, world size, model, impl); return its JSON dict.

    ``progress(text)`` is called after every training run (optional). ``memo``
    (a dict) keeps the mutants' verdicts across calls, so calibrating several
    correct implementations on one model runs every mutant once.
    """
    from conformance.cases.table import CASES

    tol = lookup(runtime, model, dtype)
    atol = tol.atol
    case = CASES.get(f"parity.{model}")
    problems, memo = [], {} if memo is None else memo
    correct, noise, noise_at, by_check = _noise(runner, runtime, world_size, model, impl, seeds, dtype, atol,
                                                problems, progress)
    mutants, excluded = [], []
    signal, signal_at = float("inf"), None
    for name in parity_mutants():
        if case is None or name not in case.must_kill:
            excluded.append({"mutant": name, "reason": f"the case table does not require parity.{model} "
                             "to kill it (see its row's must_kill)"})
            continue
        row, weakest = _mutant_signal(runner, (runtime, world_size, model, dtype), name, seeds, atol, noise,
                                      problems, progress, memo)
        if len(row["silent_seeds"]) == len(seeds):
            excluded.append({"mutant": name, "reason": f"indistinguishable from a correct run on "
                             f"{model}: at every seed every check deviates <= {SILENT_FACTOR:g} x the "
                             f"noise floor {noise:.3g} (the model does not exercise the mutation)"})
            row["excluded"] = True  # its runs stay in "mutants", for the record
        elif weakest < signal:
            signal, signal_at = weakest, {"mutant": name, **(row["signal_at"] or {})}
        mutants.append(row)

    ratio = signal / noise if noise > 0 else float("inf")
    if not any(not m.get("excluded") for m in mutants):
        problems.append(f"no mutant of the catalog is visible on {model}: no signal")
        signal = float("nan")
    problems += _gate(atol, noise, signal, ratio)
    from conformance.cases.shared.checks import UNBOUNDED  # numpy: this CLI module stays light
    return {
        "runtime": runtime, "world_size": world_size, "model": model, "impl": impl, "dtype": dtype,
        "seeds": list(seeds), "lr": tol.lr, "steps": tol.steps, "atol": atol, "loss_atol": tol.loss_atol,
        "checks": [c for c in (case.checks if case else ()) if c not in UNBOUNDED],
        "noise": _num(noise), "noise_at": noise_at, "noise_by_check": by_check, "signal": _num(signal), "signal_at": signal_at,
        "atol_over_noise": _num(atol / noise) if noise > 0 else None,
        "signal_over_atol": _num(signal / atol),
        "signal_over_noise": _num(ratio),
        "ok": not problems, "problems": problems,
        "correct": correct, "mutants": mutants, "excluded": excluded,
    }


def _noise(runner, runtime, world_size, model, impl, seeds, dtype, atol, problems, progress):
    """``(runs, noise, noise_at, by_check)`` of the correct implementation over ``seeds``: its
    runs' checks, the largest deviation (on the scale of ``atol``) and where, the largest per
    check; a run that does not pass is added to ``problems``."""
    correct, noise, noise_at, by_check = [], 0.0, None, {}
    for seed in seeds:
        vs = runner.verdicts(runtime, world_size, impl, model, dtype, seed=seed)
        runner.forget()  # a sweep keeps no trajectories (mlp: ~27 MB per run)
        correct.append({"seed": seed, "checks": _checks_json(vs)})
        for name, v in vs.items():
            if v.status != "pass":
                problems.append(f"correct run {impl} seed {seed}: {name} is {v.status}"
                                + (f" ({v.reason})" if v.reason else ""))
            dev = _scaled(v, atol)
            if math.isnan(v.max_dev):
                continue
            by_check[name] = max(by_check.get(name, 0.0), dev)
            if dev >= noise:
                noise, noise_at = dev, {"check": name, "seed": seed}
        if progress:
            progress(f"{impl} seed {seed}")
    return correct, noise, noise_at, by_check


def _mutant_signal(runner, where, name, seeds, atol, noise, problems, progress, memo) -> tuple[dict, float]:
    """``(row, weakest)`` of mutant ``name`` over ``seeds`` on ``where`` = ``(runtime, W, model,
    dtype)``: the row holds each seed's run (its signal: the largest deviation among the checks
    that kill it; silent when none does and every check stays within ``SILENT_FACTOR`` x
    ``noise``), its weakest non-silent seed (``signal_at``) and its silent seeds; ``weakest`` is
    that seed's signal. A seed it survives goes to ``problems``."""
    runtime, world_size, model, dtype = where
    runs, weakest, weakest_at, silent = [], float("inf"), None, []
    for seed in seeds:
        key = (runtime, world_size, name, model, dtype, seed)
        if key not in memo:
            memo[key] = runner.verdicts(runtime, world_size, f"mutant:{name}", model, dtype, seed=seed)
            runner.forget()
        vs = memo[key]
        killers = [n for n, v in vs.items() if v.status == "fail"]
        devs = {n: _scaled(v, atol) for n, v in vs.items()}
        pool = killers or list(vs)
        best = max(pool, key=lambda n: devs[n]) if pool else None
        s = devs[best] if best else 0.0
        quiet = not killers and all(d <= SILENT_FACTOR * noise for d in devs.values())
        runs.append({"seed": seed, "killed_by": killers, "signal": _num(s), "signal_check": best,
                     "silent": quiet, "checks": _checks_json(vs)})
        if progress:
            progress(f"mutant:{name} seed {seed}")
        if quiet:  # the mutation did not change the run at this seed: no signal to measure
            silent.append(seed)
            continue
        if not killers:
            problems.append(f"mutant {name} survives seed {seed} on {model} "
                            f"(largest deviation {s:.3g} <= atol {atol:.3g})")
        if s < weakest:
            weakest, weakest_at = s, {"seed": seed, "check": best}
    return {"mutant": name, "signal": _num(weakest), "signal_at": weakest_at,
            "silent_seeds": silent, "runs": runs}, weakest


def _gate(atol: float, noise: float, signal: float, ratio: float) -> list[str]:
    """The placement conditions (module docstring) that ``atol`` fails, one line each."""
    problems = []
    if not (atol >= MIN_SIDE_FACTOR * noise):
        problems.append(f"atol {atol:.3g} < {MIN_SIDE_FACTOR:g} x noise {noise:.3g}")
    if not (atol * MIN_SIDE_FACTOR <= signal):
        problems.append(f"atol {atol:.3g} > signal {signal:.3g} / {MIN_SIDE_FACTOR:g}")
    if not (ratio >= MIN_SIGNAL_TO_NOISE):
        problems.append(f"signal/noise {ratio:.3g} < {MIN_SIGNAL_TO_NOISE:g}")
    return problems


def summary_text(cal: dict) -> str:
    """The human summary of one calibration (what ``calibrate`` prints)."""
    def f(x):
        return "-" if x is None else format(x, ".3g")
    lines = [f"calibration: runtime {cal['runtime']}, W={cal['world_size']}, model {cal['model']}, "
             f"impl {cal['impl']}, dtype {cal['dtype']}, seeds {cal['seeds'][0]}..{cal['seeds'][-1]} "
             f"({len(cal['seeds'])})",
             f"  table: atol {cal['atol']:.3g} (loss_atol {cal['loss_atol']:.3g}), lr {cal['lr']:g}, "
             f"steps {cal['steps']}",
             f"  noise floor  {f(cal['noise'])}  (largest deviation of a correct run: "
             f"{(cal['noise_at'] or {}).get('check')} at seed {(cal['noise_at'] or {}).get('seed')}; by check: "
             + ", ".join(f"{c} {d:.3g}" for c, d in cal.get("noise_by_check", {}).items()) + ")",
             f"  signal       {f(cal['signal'])}  (weakest mutant: {(cal['signal_at'] or {}).get('mutant')}, "
             f"{(cal['signal_at'] or {}).get('check')} at seed {(cal['signal_at'] or {}).get('seed')})",
             f"  margins      atol/noise {f(cal['atol_over_noise'])}x (need >= {MIN_SIDE_FACTOR:g}), "
             f"signal/atol {f(cal['signal_over_atol'])}x (need >= {MIN_SIDE_FACTOR:g}), "
             f"signal/noise {f(cal['signal_over_noise'])}x (need >= {MIN_SIGNAL_TO_NOISE:g})",
             "  per mutant (weakest non-silent seed: largest deviation among the checks that kill it):"]
    for m in cal["mutants"]:
        if m.get("excluded"):
            continue
        at = m["signal_at"] or {}
        lines.append(f"    {m['mutant']:<22} {f(m['signal'])}  ({at.get('check')}, seed {at.get('seed')})"
                     + (f"; silent at seed(s) {', '.join(map(str, m['silent_seeds']))}: the mutation "
                        "did not change the run" if m.get("silent_seeds") else ""))
    for e in cal["excluded"]:
        lines.append(f"    {e['mutant']:<22} excluded: {e['reason']}")
    lines.append("  verdict: " + ("OK" if cal["ok"] else "NOT CALIBRATED: " + "; ".join(cal["problems"])))
    return "\n".join(lines)


def command(settings, *, runtime: str, model: str, ddp: str, seeds: int, world_size: str,
            json: str | None) -> int:
    """The ``calibrate`` subcommand (see the module docstring)."""
    from conformance.evaluate import Session

    runtimes, models, impls, w = parse_calibration(runtime, model, ddp, seeds, world_size)
    runner = ParityRunner(Session(WorldPool(settings), settings=settings))
    cals, memo = [], {}
    t0 = time.monotonic()
    try:
        for rt in runtimes:
            for m in models:
                base = lookup(rt, m).seed
                seed_list = [base + k for k in range(seeds)]
                for impl in impls:
                    cal = calibrate(runner, rt, w, m, impl, seed_list, memo=memo)
                    cals.append(cal)
                    print(summary_text(cal), flush=True)
                    print()
    finally:
        runner.close()
    doc = document("calibration", wall_seconds=round(time.monotonic() - t0, 1),
                   criteria={"atol_over_noise": MIN_SIDE_FACTOR, "signal_over_atol": MIN_SIDE_FACTOR,
                             "signal_over_noise": MIN_SIGNAL_TO_NOISE},
                   calibrations=cals)
    if json:
        write_json_doc(json, doc)
        print(f"calibration JSON: {json}")
    bad = [c for c in cals if not c["ok"]]
    print(f"{len(cals) - len(bad)}/{len(cals)} calibrated" + (
        "; NOT calibrated: " + ", ".join(f"{c['runtime']}/{c['model']}/{c['impl']}" for c in bad) if bad else ""))
    return 1 if bad else 0


def add_parser(sub):
    p = sub.add_parser("calibrate", help="measure noise (correct runs over seeds) and signal (mutants) "
                       "against the tolerance table's atol")
    p.add_argument("--runtime", default="cpu", help="runtime (comma list allowed; default cpu)")
    p.add_argument("--model", required=True, help="model (comma list allowed), e.g. linear")
    p.add_argument("--ddp", default="ref", help="the correct implementation(s) measured for noise "
                   "(comma list; default ref)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help=f"number of seeds: table seed + 0..N-1 (default {DEFAULT_SEEDS})")
    p.add_argument("--world-size", default="2", help="world size >= 2 (default 2)")
    p.add_argument("--json", default=None, help="write the calibration (per-step deviations) here")
    return p
