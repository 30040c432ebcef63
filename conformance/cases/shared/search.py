"""Hypothesis machinery shared by the search kinds (properties, scenarios): the example
budgets per profile, the settings of every kit search, and the runner that ships a search's examples to a world.

Hypothesis settings are applied per run (never through global profiles), so the kit
changes nothing in other projects' Hypothesis configuration. Budgets: :data:`PROFILES`,
selected by name (``Settings.profile``: CLI ``--profile``, pytest ``--conformance-profile``,
absl ``--profile``, or the environment, read by :mod:`conformance.settings`).
"""
from __future__ import annotations

from dataclasses import dataclass

from conformance.errors import UsageError
from conformance.settings import DEFAULT_PROFILE


@dataclass(frozen=True)
class Budget:
    """Examples per case of one profile (shrinking comes on top on a failure).

    ``properties``: per property case; ``scenarios``: per scenario case (each example a
    training run; a case's ``space.budget`` takes a fraction of it); ``workloads``: generated
    examples of the workload case (``scenario.workload``: each a drawn workload, after its
    explicit scenarios, which cover every corner); ``workloads_compiled``: the same on a
    runtime where every distinct graph is compiled (XLA), where each drawn workload costs
    compilations (0: the explicit scenarios only); ``loop_depth``: the most distinct steps a
    generated loop program repeats (``scenario.loop``: each step its own accumulation window,
    synced backwards and forwards without backward); ``loops_compiled``: generated loop programs
    on a runtime where every distinct graph is compiled (0: the explicit ones only; each program
    is new graphs)."""

    properties: int
    scenarios: int
    workloads: int
    workloads_compiled: int
    loop_depth: int = 4
    loops_compiled: int = 0


#: The example budgets, by profile name. The default (dev) workload draw is small: the default
#: run's time is the budget (benchmarks/README.md); ``thorough`` goes ~100x deeper.
PROFILES = {
    "dev": Budget(properties=25, scenarios=12, workloads=2, workloads_compiled=0),
    "ci": Budget(properties=200, scenarios=40, workloads=12, workloads_compiled=0),
    "ci-pjrt": Budget(properties=50, scenarios=8, workloads=3, workloads_compiled=0),
    "thorough": Budget(properties=2000, scenarios=500, workloads=300, workloads_compiled=25, loop_depth=8,
                       loops_compiled=25),
}


def profile_name(name: str | None = None) -> str:
    """``name``, else the default profile (faces pass ``Settings.profile``).

    Raises:
        UsageError: unknown profile.
    """
    name = name or DEFAULT_PROFILE
    if name not in PROFILES:
        raise UsageError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return name


def profile_examples(name: str | None = None) -> int:
    """Examples per property of profile :func:`profile_name` ``(name)``."""
    return PROFILES[profile_name(name)].properties


def scenario_examples(name: str | None = None, fraction: float = 1.0) -> int:
    """Examples of a scenario case taking ``fraction`` of profile :func:`profile_name` ``(name)``'s
    budget (at least one)."""
    return max(1, round(PROFILES[profile_name(name)].scenarios * fraction))


def workload_examples(name: str | None = None, compiled: bool = False) -> int:
    """Generated examples of the workload case under profile :func:`profile_name` ``(name)``
    (``compiled``: on a runtime that compiles every distinct graph)."""
    b = PROFILES[profile_name(name)]
    return b.workloads_compiled if compiled else b.workloads


def loop_depth(name: str | None = None) -> int:
    """The most distinct steps of a generated loop program under profile :func:`profile_name` ``(name)``."""
    return PROFILES[profile_name(name)].loop_depth


def loop_examples(name: str | None = None, fraction: float = 1.0) -> int:
    """Generated loop programs under profile :func:`profile_name` ``(name)`` on a runtime that
    compiles every distinct graph (``fraction`` of ``Budget.loops_compiled``; 0: explicit only)."""
    return round(PROFILES[profile_name(name)].loops_compiled * fraction)


def kit_settings(max_examples: int, shrink: bool = True):
    """The Hypothesis settings of every kit search (properties and scenarios), applied per
    test so no global profile changes: derandomized, no example database, no deadline,
    shrinking on unless ``shrink`` is false (the kill matrix only asks whether a search
    fails), the explain phase off (it reruns failing examples for nothing we report)."""
    from hypothesis import HealthCheck, Phase, settings
    off = {Phase.explain} | (set() if shrink else {Phase.shrink})
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    print_blob=True, phases=[p for p in Phase if p not in off],
                    suppress_health_check=list(HealthCheck))


class SearchRunner:
    """Runs a search's examples on one (runtime, world size, implementation): not a world
    itself, it holds the function that ships a task to the session's world and what the
    search has seen there (``runs``, the first ``error``).

    ``run(task, **payload)`` ships one example to the world. The first replica
    failure or ``Unsupported`` is remembered and raised again at once for every
    later example, so Hypothesis shrinks a deterministic crash without touching
    the world again (seconds, not minutes).
    """

    def __init__(self, run_task, runtime: str, world_size: int, impl: str):
        self._run_task, self.runtime, self.world_size, self.impl = run_task, runtime, world_size, impl
        self.runs = 0
        self.error: BaseException | None = None

    def run(self, fn, **payload) -> list:
        if self.error is not None:
            raise self.error
        self.runs += 1
        try:
            return self._run_task(fn, impl=self.impl, **payload)
        except Exception as exc:  # ReplicaError or Unsupported
            self.error = exc
            raise

    def describe(self) -> str:
        return f"impl={self.impl} runtime={self.runtime} world_size={self.world_size}"
