"""One Settings: the environment gives defaults, each face's options override them, and
every option that shapes a run takes effect (measured through the main command)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from conformance import options, plugin
from conformance.cases.table import CASES, select
from conformance.errors import UsageError
from conformance.settings import ENVIRONMENT, Settings, default_impls, default_world_sizes
from conformance.worlds.runtimes import RUNTIMES

from .procs import REPO, run_cli


def test_options_override_the_environment_and_the_environment_overrides_defaults():
    env = {"CONFORMANCE_TIMEOUT": "33", "CONFORMANCE_PROFILE": "ci"}
    assert Settings.from_env({}).replica_timeout == ENVIRONMENT["replica_timeout"][1]
    assert Settings.from_env(env).replica_timeout == 33.0
    assert Settings.from_env(env).profile == "ci"
    assert Settings.from_env(env, replica_timeout=7.0, profile="thorough") == Settings(
        replica_timeout=7.0, profile="thorough")


@pytest.mark.parametrize("env, options, names", [
    ({"CONFORMANCE_TIMEOUT": "soon"}, {}, "CONFORMANCE_TIMEOUT"),
    ({}, {"replica_timeout": -1.0}, "--replica-timeout"),
    ({}, {"start_timeout": 0.0}, "--start-timeout"),
    ({"CONFORMANCE_PROFILE": "fast"}, {}, "CONFORMANCE_PROFILE"),
    ({"CONFORMANCE_LANES": "two"}, {}, "CONFORMANCE_LANES"),
    ({"CONFORMANCE_LANES": "0"}, {}, "CONFORMANCE_LANES"),
    ({}, {"lanes": 9}, "--lanes"),
])
def test_a_bad_value_is_one_usage_error_naming_its_option(env, options, names):
    with pytest.raises(UsageError, match=names):
        Settings.from_env(env, **options)


def _pytest_matrix(runtime):
    config = SimpleNamespace(getoption=lambda name, default=None: runtime if name == "--conformance-runtime" else None)
    return [(rt, w, tuple(plugin.impls_for(config, rt))) for rt, w, _ in plugin.runtime_worlds(config)]


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_every_face_runs_the_same_default_matrix(runtime):
    """CLI and absltest (``options.parse_matrix``) and the pytest plugin, given no options."""
    cases = select([], [])  # every row at the runtime's world sizes, or at its own (Case.world_sizes)
    sizes = sorted({w for c in cases for w in options.case_world_sizes(c, runtime)})
    assert set(options.parse_world_sizes(None, runtime)) <= set(sizes)
    cli = [(runtime, w, tuple(default_impls(runtime))) for w in sizes]
    assert _pytest_matrix(runtime) == cli
    if runtime == "cpu":  # the only runtime every machine can validate end to end
        got = [(rt, w, tuple(i)) for rt, w, i in options.parse_matrix("cpu", None, None, cases=cases)]
        assert got == cli


def test_a_case_runs_at_its_own_world_sizes_only_by_default():
    """feature.subgroups adds W=4 to the default CPU run for itself only; --world-size overrides."""
    sub, lin = CASES["feature.subgroups"], CASES["parity.linear"]
    assert options.case_world_sizes(sub, "cpu") == [3, 4]
    assert options.case_world_sizes(lin, "cpu") == list(default_world_sizes("cpu"))
    assert options.case_runs_at(sub, "cpu", 4, None) and not options.case_runs_at(lin, "cpu", 4, None)
    assert not options.case_runs_at(sub, "cpu", 2, None) and options.case_runs_at(sub, "cpu", 2, "2")


SLEEPY = textwrap.dedent('''
    import time
    import torch


    class SleepyDDP(torch.nn.Module):
        """Every replica sleeps far longer than the timeout in its first forward."""

        def __init__(self, module, **kwargs):
            super().__init__()
            self.module, self.slept = module, False

        def forward(self, *args, **kwargs):
            if not self.slept:
                self.slept = True
                time.sleep(600)
            return self.module(*args, **kwargs)
''')


@pytest.mark.cpu
@pytest.mark.long
def test_replica_timeout_option_bounds_the_task(tmp_path):
    """``--replica-timeout 5`` ends a run whose replicas all sleep 600 s: exit 1 and the
    verdict names the 5 s bound (with the old import-time read it waited 120 s and passed)."""
    (tmp_path / "sleepy.py").write_text(SLEEPY)
    r = run_cli("run", "--ddp", "sleepy:SleepyDDP", "--world-size", "2", "--only", "parity.linear",
                "--replica-timeout", "5", "--quiet", "--json", str(tmp_path / "r.json"),
                cwd=tmp_path, extra_path=str(tmp_path), timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert {v["status"] for v in doc["verdicts"]} == {"fail"}
    assert all("within 5 s" in v["reason"] for v in doc["verdicts"]), [v["reason"] for v in doc["verdicts"]]


def test_usage_errors_come_before_torch_is_imported():
    # json:Y: a module that is there (one that is not is itself an early error)
    code = ("import sys; from conformance import cli\n"
            "try:\n    cli.parse(['run', '--world-size', '1'])\nexcept Exception as e:\n    print(type(e).__name__)\n"
            "cli.parse(['run', '--ddp', 'json:Y', '--replica-timeout', '3'])\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.split() == ["UsageError", "False"], out.stdout + out.stderr


def test_the_profile_names_are_the_budget_table_s():
    """settings validates profile names without importing the searches; the two must agree."""
    from conformance.cases.shared.search import PROFILES as BUDGETS
    from conformance.settings import PROFILES
    assert tuple(BUDGETS) == PROFILES


def test_a_registered_runtime_brings_its_defaults_to_every_face():
    """A new runtime is its adapter and one registration: Settings, option parsing and the
    pytest face read its facts (default world sizes and implementations, largest world,
    emulated hosts, launcher support) from the adapter, with no other edit."""
    import warnings

    from conformance.settings import emulated_hosts, max_world_size
    from conformance.worlds.launched import external_runtimes
    from conformance.worlds.runtimes import Runtime, WorldKey, get_runtime, register, unregister

    class ToyRuntime(Runtime):
        name = "toy"
        default_world_sizes = (4, 5)
        default_impls = ("ref",)
        max_world_size = 6
        hosts_field = "cpu_hosts"  # borrows the CPU runtime's host layout

    register("toy", ToyRuntime)
    try:
        assert default_world_sizes("toy") == (4, 5) and default_impls("toy") == ("ref",)
        assert max_world_size("toy") == 6
        assert options.parse_runtime_names("cpu,toy") == ["cpu", "toy"]
        assert options.parse_world_sizes(None, "toy") == [4, 5]
        assert options.parse_impl_names(None, "toy") == ["ref"]
        assert options.parse_matrix("toy", None, None) == [("toy", 4, ["ref"]), ("toy", 5, ["ref"])]
        with pytest.raises(UsageError, match=r"^--world-size 7: runtime toy runs world sizes 2\.\.6$"):
            options.parse_matrix("toy", "7", None)
        lin = CASES["parity.linear"]
        assert options.case_world_sizes(lin, "toy") == [4, 5]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the pytest mark "toy" is not registered in this project
            assert _pytest_matrix("toy") == [("toy", 4, ("ref",)), ("toy", 5, ("ref",))]
        assert emulated_hosts(Settings(cpu_hosts=((4, 2),)), 4, "toy") == 2
        assert "toy" not in external_runtimes()
        assert isinstance(get_runtime("toy"), ToyRuntime) and WorldKey("toy", 4).world == "toy"
    finally:
        unregister("toy")
    with pytest.raises(UsageError, match="unknown runtime 'toy'"):
        options.parse_runtime_names("toy")


def test_the_doc_lists_the_runtime_facts():
    """docs/extending.md "A new runtime" names every fact of a runtime adapter, and only those."""
    import re

    from conformance.worlds.runtimes import Runtime
    with open(f"{REPO}/docs/extending.md") as f:
        text = f.read().split("## A new runtime", 1)[1]
    doc = re.findall(r"^\| `(\w+)` \|", text, re.M)
    assert doc == list(Runtime.FACTS)
    assert all(hasattr(Runtime, fact) for fact in Runtime.FACTS)


def test_a_pool_whose_results_reach_the_root_only_skips_the_searches():
    """A launcher-built world's pool says so with ``sees_every_result = False`` (no class-name
    test): a searching kind is skipped there with the reason, before any world is asked for."""
    from conformance.evaluate import Session, evaluate
    from conformance.worlds.launched import ExternalPool
    from conformance.worlds.pool import Pool

    class RootOnly(Pool):
        sees_every_result = False

        def get(self, world):
            raise AssertionError("no world is needed to skip")

        def close(self):
            pass

    assert ExternalPool.sees_every_result is False
    verdicts = evaluate(CASES["property.allreduce_mean"], "ref", "cpu", 2, Session(pool=RootOnly()))
    assert verdicts and {v.status for v in verdicts} == {"skip"}
    assert all("need a world the kit spawns" in v.reason for v in verdicts)


def test_the_collective_family_judges_the_runtimes_that_say_so():
    from conformance.cases.collective.kind import evaluate
    from conformance.worlds.runtimes import runtime_class
    assert [r for r in RUNTIMES if runtime_class(r).collectives_judged] == ["cpu", "pjrt"]
    case = next(c for c in CASES.values() if c.kind == "collective")
    verdicts = evaluate(case, "ref", "xrt", 2, session=None, overrides={})
    assert {v.status for v in verdicts} == {"skip"} and {v.reason for v in verdicts} == {
        "the collective family runs on the CPU runtime (torch.distributed) and on PJRT (torch_xla); xrt's "
        "collectives are not judged op by op yet"}
