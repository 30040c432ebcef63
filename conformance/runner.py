"""Run checks: one training run per (runtime, world size, implementation, model),
shared by every check of the table, compared with the cached reference.
"""
from __future__ import annotations

from .checks import CHECKS, Verdict, evaluate
from .harness import RunSpec, train_replica
from .impls import resolve_impl
from .reference import reference_run
from .tolerances import lookup
from .world import WorldPool


def checks_for(model: str, spec: RunSpec | None = None) -> list[str]:
    """Names of the checks that apply to ``model`` (run with ``spec``)."""
    from fixtures.models import MODELS
    spec = spec or RunSpec.from_table("cpu", "ref", model)
    return [c.name for c in CHECKS.values() if c.applies(MODELS[model], spec)]


class Runner:
    """Runs and caches training runs on a :class:`WorldPool`.

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
        reps = self.trajectories(runtime, world_size, spec)
        if "unsupported" in reps[0]:
            return unsupported(reps[0]["unsupported"])
        ref = reference_run(spec, world_size)
        tol = lookup(runtime, model, dtype)
        return {n: evaluate(CHECKS[n], reps, ref, tol, impl=impl, runtime=runtime, model=model)
                for n in names}

    def close(self):
        self.pool.close()
