"""The one entry point: ``evaluate(case, impl, runtime, world_size) -> list[Verdict]``.

Every face calls it. It resolves the implementation, applies the row's skips,
runs the case on a persistent world of the :class:`Session`, and turns every
outcome into verdicts - one per check the row declares, whatever happens:

* :class:`~conformance.errors.Unsupported` raised anywhere (a replica, a
  wrapper, a setup, a property) -> ``unsupported`` with the reason (the one place
  it is caught);
* a replica that raised, hung or died -> ``fail`` with the replica's summary in
  ``reason`` and the full text (tracebacks, stacks, log tails) in ``diagnosis``;
* a runtime that cannot run here -> ``skip`` with the runtime's reason.
"""
from __future__ import annotations

from conformance.cases.row import Case
from conformance.errors import Unsupported
from conformance.verdict import Verdict

_UNSUPPORTED = "__unsupported__"


def guarded(ctx, task_fn_, **payload):
    """World task wrapper: run ``__task(ctx, **payload)``; an ``Unsupported`` raised
    in the replica comes back as a marker (re-raised by :meth:`Session.run`)."""
    try:
        return task_fn_(ctx, **payload)
    except Unsupported as exc:
        return {_UNSUPPORTED: exc.reason}


def replica_error_text(exc) -> tuple[str, str]:
    """``(one-line summary, full text)`` of a world failure."""
    if callable(getattr(exc, "summary", None)):
        return exc.summary(), exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    text = str(exc)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"
    tail = lines[-1].strip()[:200] if len(lines) > 1 else ""
    return head + (f" ... {tail}" if tail else ""), text


def _jsonable(obj):
    """``obj`` with anything JSON cannot hold turned into its ``str``."""
    import json
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        if isinstance(obj, dict):
            return {str(k): _jsonable(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [_jsonable(v) for v in obj]
        return str(obj)


class Session:
    """Persistent worlds and cached training runs shared by every evaluation.

    Args:
        pool: anything with ``get(runtime, world_size) -> world`` and ``close()``
            (default: a new :class:`conformance.worlds.spawned.WorldPool`); a
            :class:`conformance.worlds.launched.ExternalPool` makes this process one
            replica of a launcher-started world (non-root ranks get ``[]``).
        profile: Hypothesis example budget name (``conformance.cases.search.PROFILES``).
    """

    def __init__(self, pool=None, profile: str | None = None):
        if pool is None:
            from conformance.worlds.spawned import WorldPool
            pool = WorldPool()
        self.pool, self.profile = pool, profile
        self._cache: dict = {}

    def run(self, runtime: str, world_size: int, fn, timeout: float | None = None, **payload):
        """Run ``fn(ctx, **payload)`` on every replica; results by rank, or ``None`` on a
        non-root process of a launcher-built world.

        Raises:
            Unsupported: a replica raised it.
            ReplicaError: a replica raised anything else, hung or died.
        """
        world = self.pool.get(runtime, world_size)
        out = world.run(guarded, timeout=timeout, task_fn_=fn, **payload)
        if out is None:
            return None
        for r in out:
            if isinstance(r, dict) and _UNSUPPORTED in r:
                raise Unsupported(r[_UNSUPPORTED])
        return out

    def trajectories(self, runtime: str, world_size: int, spec) -> list | None:
        """Every replica's :func:`~conformance.cases.train.loop.train_replica` result (cached per spec)."""
        from conformance.cases.train.loop import train_replica
        key = (runtime, world_size, spec)
        if key not in self._cache:
            self._cache[key] = self.run(runtime, world_size, train_replica, spec=spec.as_dict())
        return self._cache[key]

    def forget(self) -> None:
        """Drop cached training runs (long sweeps: calibrate, run --repeat)."""
        self._cache.clear()

    def close(self) -> None:
        self.pool.close()


_DEFAULT: Session | None = None


def default_session() -> Session:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Session()
    return _DEFAULT


def evaluate(case: Case, impl: str, runtime: str, world_size: int, session: Session | None = None,
             *, shrink: bool = True, **overrides) -> list[Verdict]:
    """Verdicts of ``case`` for implementation ``impl`` on ``runtime`` with ``world_size`` replicas.

    ``overrides`` change the run of ``train`` cases (``seed``, ``lr``, ``steps``:
    calibration and flakiness sweeps); for a ``scenario`` case, ``scenario=``
    (a :class:`~conformance.cases.scenarios.scenario.Scenario`) runs that one scenario only; ``shrink=False``
    reports a failing property or scenario search as found, not shrunk to a minimal
    counterexample (the kill matrix only needs to know that it fails). Returns one verdict per ``case.checks``
    entry (``[]`` on a non-root process of a launcher-built world).

    Raises:
        ImplSpecError: ``impl`` names nothing usable (callers validate first).
    """
    from conformance.impls.builtin import resolve_impl
    from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime
    session = session or default_session()
    if case.kind in ("property", "scenario"):  # the searches' evaluators read it from overrides
        overrides["shrink"] = shrink
    row = resolve_impl(impl)
    model = case.model

    def each(status, reason, diagnosis=""):
        return [Verdict(case.name, c, impl, runtime, model, world_size, status, reason=reason,
                        diagnosis=diagnosis, family=case.family) for c in case.checks]

    why = case.skip_reason(runtime, impl)
    if case.kind in ("property", "scenario") and type(session.pool).__name__ == "ExternalPool":
        why = (f"{case.family} cases need a world the kit spawns: Hypothesis draws each example from "
               "the result of the last one, which only the root process of a launcher-built world sees")
    if why:
        return each("skip", why)
    try:
        get_runtime(runtime).check(world_size)
    except RuntimeUnavailable as exc:
        return each("skip", f"runtime {runtime}: {exc}")
    from conformance.worlds.spawned import ReplicaError
    try:
        if row.unsupported.get(runtime) and case.kind != "invariant":  # rank bindings need no DDP
            raise Unsupported(row.unsupported[runtime])
        if case.kind in row.unsupported_kinds:
            raise Unsupported(row.unsupported_kinds[case.kind])
        verdicts = _EVALUATORS[case.kind](case, impl, runtime, world_size, session, overrides)
    except Unsupported as exc:
        return each("unsupported", exc.reason)
    except ReplicaError as exc:
        summary, text = replica_error_text(exc)
        out = each("fail", summary, text)
        for v in out:
            v.replicas = _jsonable(getattr(exc, "diagnosis", None) or [])
        return out
    if verdicts is None:  # non-root process of a launcher-built world: rank 0 judges
        return []
    for v in verdicts:
        v.case, v.family, v.impl, v.runtime, v.world_size = case.name, case.family, impl, runtime, world_size
        v.model = model
    return verdicts


def _train(case, impl, runtime, w, session, overrides):
    from conformance.cases.checks import AGREEMENT, CHECKS, judge, judge_agreement
    from conformance.cases.train.loop import RunSpec
    from conformance.impls.builtin import resolve_impl
    from conformance.cases.train.reference import reference_run
    from conformance.tolerances import lookup
    from conformance.worlds.runtimes import world_for
    row = resolve_impl(impl)
    spec = RunSpec.from_table(runtime, impl, case.model, case.tolerance, **dict(case.run, **overrides))
    world_runtime, n = world_for(runtime, row.topology.get(runtime), w)
    reps = session.trajectories(world_runtime, n, spec)
    if reps is None:
        return None
    ref = reference_run(spec, w, world_runtime)  # the quirks of the runtime that ran it
    tol = lookup(runtime, case.model, case.tolerance)
    out = []
    for name in case.checks:
        if name == AGREEMENT and not row.holds_copies:
            out.append(Verdict(case.name, name, impl, runtime, case.model, w, "skip",
                               reason=f"{impl} {row.no_copies_reason}"))
        elif name == AGREEMENT:
            out.append(judge_agreement(reps, case=case.name, impl=impl, runtime=runtime, model=case.model,
                                       atol=lookup(runtime, case.model, "agreement").atol))
        else:
            out.append(judge(CHECKS[name], reps, ref, tol, case=case.name, impl=impl, runtime=runtime,
                             model=case.model, world_size=w))
    return out


def _task(case, impl, runtime, w, session, overrides):
    results = session.run(runtime, w, case.task, timeout=case.timeout, impl=impl, **case.args)
    if results is None:
        return None
    verdicts = case.judge(results, impl, runtime)
    got = [v.check for v in verdicts]
    assert got == list(case.checks), f"{case.name}: judge gave checks {got}, the row declares {case.checks}"
    return verdicts


def _property(case, impl, runtime, w, session, overrides):
    from conformance.cases.properties.run import run_property
    from conformance.cases.search import Target, profile_examples
    target = Target(lambda fn, **p: session.run(runtime, w, fn, **p), runtime, w, impl)
    fields = run_property(case.prop, target, profile_examples(session.profile), overrides.get("shrink", True))
    return [Verdict(case.name, "property", impl, runtime, case.model, w, **fields)]


def _invariant(case, impl, runtime, w, session, overrides):
    from conformance.cli.ranks import check_reports
    from conformance.worlds.tasks import rank_report
    reports = session.run(runtime, w, rank_report)
    if reports is None:
        return None
    bad = check_reports(reports, w)
    v = Verdict(case.name, "ranks", impl, runtime, case.model, w, "fail" if bad else "pass",
                reason="; ".join(bad)[:300] if bad else f"{w} replica(s) on "
                f"{len({r['host'] for r in reports})} host(s)", diagnosis="\n".join(bad))
    if not bad and w < 2:
        v.status, v.reason = "vacuous", f"world size {w}: nothing to check across replicas"
    return [v]


def _scenario(case, impl, runtime, w, session, overrides):
    from dataclasses import replace

    from conformance.cases.scenarios.scenario import Space, run_scenario_case
    from conformance.cases.search import Target, scenario_examples
    from conformance.worlds.runtimes import get_runtime
    from conformance.tolerances import lookup
    tol, agree = lookup(runtime, "scenario"), lookup(runtime, "scenario", "agreement").atol
    if "scenario" in overrides:  # one given scenario (python -m conformance replay)
        from conformance.cases.scenarios.scenario import judge_scenario, scenario_task
        sc = overrides["scenario"]
        results = session.run(runtime, w, scenario_task, timeout=case.timeout, impl=impl, scenario=sc.to_json())
        return None if results is None else judge_scenario(sc, results, tol, agreement_atol=agree)
    target = Target(lambda fn, **p: session.run(runtime, w, fn, timeout=case.timeout, **p), runtime, w, impl)
    space = Space(**case.args.get("space", {}))
    if get_runtime(runtime).uniform_graphs:
        space = replace(space, rank_uniform=True)
    return run_scenario_case(space, target, tol, agree, scenario_examples(session.profile, space.budget),
                             overrides.get("shrink", True))


_EVALUATORS = {"train": _train, "task": _task, "property": _property, "invariant": _invariant,
               "scenario": _scenario}
