"""Hypothesis machinery shared by the search kinds: the example budgets per profile
(:data:`PROFILES`, selected by ``Settings.profile``), the settings of every kit search, applied per
run (never through global profiles, so other projects' Hypothesis configuration is untouched),
and the runner that ships a search's examples to a world.
"""
from __future__ import annotations

from dataclasses import dataclass

from conformance.errors import UsageError
from conformance.settings import DEFAULT_PROFILE


@dataclass(frozen=True)
class Budget:
    """Examples per case of one profile (shrinking comes on top on a failure).

    ``properties``: per property case; ``scenarios``: per scenario case (a case's ``space.budget``
    takes a fraction of it); ``workloads``: generated examples of ``scenario.workload`` (after its
    explicit scenarios, which cover every corner); ``workloads_compiled`` / ``loops_compiled``:
    generated workloads / loop programs on a runtime where every distinct graph is compiled (XLA;
    0: the explicit ones only); ``loop_depth``: the most distinct steps a generated loop program
    repeats; ``zoo`` / ``zoo_cost``: how many zoo models ``scenario.zoo`` draws, of which cost class
    (``fixtures.zoo.COSTS``); ``zoo_programs``: the loop programs it runs on each (indices into
    ``userloop.user_loop_programs``; ``None``: all); ``topologies``: generated module graphs of
    ``scenario.topology`` (CPU: drawn graphs are never compiled)."""

    properties: int
    scenarios: int
    workloads: int
    workloads_compiled: int
    loop_depth: int = 4
    loops_compiled: int = 0
    zoo: int = 1
    zoo_cost: int = 1
    zoo_programs: tuple | None = None
    topologies: int = 4


#: The example budgets, by profile name. The default (dev) workload draw is small: the default
#: run's time is the budget (benchmarks/README.md); ``thorough`` goes ~100x deeper.
PROFILES = {
    # dev: on the drawn zoo model, the programs with a no_sync window, eval forwards and a reload
    "dev": Budget(properties=25, scenarios=12, workloads=2, workloads_compiled=0, zoo_programs=(0, 2), topologies=4),
    "ci": Budget(properties=200, scenarios=40, workloads=12, workloads_compiled=0, zoo=3, zoo_cost=2, topologies=40),
    "ci-pjrt": Budget(properties=50, scenarios=8, workloads=3, workloads_compiled=0, zoo=0, topologies=0),
    "thorough": Budget(properties=2000, scenarios=500, workloads=300, workloads_compiled=25, loop_depth=8,
                       loops_compiled=25, zoo=100, zoo_cost=3, topologies=1000),
}


def profile_budget(name: str | None = None) -> Budget:
    """The budget of profile ``name``, else of the default profile (faces pass ``Settings.profile``).

    Raises:
        UsageError: unknown profile.
    """
    name = name or DEFAULT_PROFILE
    if name not in PROFILES:
        raise UsageError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]


def profile_examples(name: str | None = None) -> int:
    """Examples per property of profile ``name`` (:func:`profile_budget`)."""
    return profile_budget(name).properties


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
    """Runs a search's examples on one (runtime, world size, implementation): ``run(task,
    **payload)`` ships one example to the session's world (``runs`` counts them). The first
    replica failure or ``Unsupported`` (``error``) is raised again at once for every later example,
    so a search does not touch a broken world again; a caller that knows the world is kept (a
    replica raised: the scenario runner) clears ``error`` and shrinks the crash on the world."""

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
