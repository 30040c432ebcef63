"""Run checks: one training run per (runtime, world size, implementation, model),
shared by every check of the table, compared with the cached reference.
"""
from __future__ import annotations

from .checks import CHECKS, Verdict, evaluate
from .harness import RunSpec, train_replica
from .impls import resolve_impl
from .reference import reference_run
from .tolerances import lookup
from .world import ReplicaError, WorldPool


def _error_reason(exc: Exception) -> str:
    text = str(exc)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # the first line names the failure; the last usually the exception raised
    return f"{type(exc).__name__}: {lines[0][:200]}" + (f" ... {lines[-1].strip()[:200]}" if len(lines) > 1 else "")


def checks_for(model: str, spec: RunSpec | None = None) -> list[str]:
    """Names of the checks that apply to ``model`` (run with ``spec``)."""
    from fixtures.models import MODELS
    spec = spec or RunSpec.from_table("cpu", "ref", model)
    return [c.name for c in CHECKS.values() if c.applies(MODELS[model], spec)]


class Runner:
    """Runs and caches training runs on a :class:`WorldPool`.

    ``pool`` is anything with ``get(runtime, world_size) -> world`` and
    ``close()``: a ``WorldPool``, or a :class:`conformance.external.ExternalPool`
    whose world was started by torchrun (then only rank 0 gets verdicts; the
    other ranks get ``{}``).

    ``verdicts(...)`` returns one :class:`Verdict` per applicable check; an
    implementation marked unsupported on the runtime yields ``unsupported``
    verdicts with the reason and runs nothing.
    """

    def __init__(self, pool: WorldPool | None = None):
        self.pool = pool or WorldPool()
        self._cache: dict = {}

    def trajectories(self, runtime: str, world_size: int, spec: RunSpec) -> list[dict]:
        key = (runtime, world_size, spec)
        if key not in self._cache:
            world = self.pool.get(runtime, world_size)
            self._cache[key] = world.run(train_replica, spec=spec.as_dict())
        return self._cache[key]

    def verdicts(self, runtime: str, world_size: int, impl: str, model: str,
                 dtype: str = "float32", **overrides) -> dict[str, Verdict]:
        row = resolve_impl(impl)
        spec = RunSpec.from_table(runtime, impl, model, dtype, **overrides)
        names = checks_for(model, spec)

        def unsupported(why):
            return {n: Verdict(n, impl, runtime, model, world_size, "unsupported", reason=why)
                    for n in names}
        if row.unsupported.get(runtime):
            return unsupported(row.unsupported[runtime])
        try:
            reps = self.trajectories(runtime, world_size, spec)
        except ReplicaError as exc:  # the implementation crashed or hung: its failure
            return {n: Verdict(n, impl, runtime, model, world_size, "fail", reason=_error_reason(exc))
                    for n in names}
        if reps is None:  # a non-root process of a launcher-built world (conformance.external): rank 0 evaluates
            return {}
        if "unsupported" in reps[0]:
            return unsupported(reps[0]["unsupported"])
        ref = reference_run(spec, world_size, runtime)
        tol = lookup(runtime, model, dtype)
        return {n: evaluate(CHECKS[n], reps, ref, tol, impl=impl, runtime=runtime, model=model)
                for n in names}

    def feature_verdicts(self, runtime: str, world_size: int, impl: str, feature: str) -> list[Verdict]:
        """Verdicts of feature ``feature`` (see :mod:`conformance.features`); each
        verdict's ``check`` is ``<feature>.<check>``."""
        from .features import FEATURES
        f = FEATURES[feature]
        row = resolve_impl(impl)
        if f.parity is not None:
            over = dict(f.parity)
            dtype = over.pop("dtype", "float32")
            out = list(self.verdicts(runtime, world_size, impl, f.model, dtype, **over).values())
        elif row.unsupported.get(runtime):
            out = [Verdict("task", impl, runtime, f.model, world_size, "unsupported",
                           reason=row.unsupported[runtime])]
        else:
            world = self.pool.get(runtime, world_size)
            try:
                results = world.run(f.task, timeout=f.timeout, impl=impl, **f.args)
            except ReplicaError as exc:
                out = [Verdict("task", impl, runtime, f.model, world_size, "fail", reason=_error_reason(exc))]
            else:
                if "unsupported" in results[0]:
                    out = [Verdict("task", impl, runtime, f.model, world_size, "unsupported",
                                   reason=results[0]["unsupported"])]
                else:
                    out = f.judge(results, impl, runtime)
        for v in out:
            v.check = f"{feature}.{v.check}"
        return out

    def forget(self):
        """Drop the cached training runs (long sweeps: calibrate, run --repeat)."""
        self._cache.clear()

    def close(self):
        self.pool.close()
