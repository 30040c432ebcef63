"""Coverage said out loud (issue 29 item 1): performance-only keywords a DDP refuses cost only
the cases about them, and the summary, JSON and HTML say what share was certified and what the
unsupported verdicts cost, grouped by cause."""
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance.cases.table import CASES
from conformance.evaluate import evaluate


class MinimalDDP(nn.Module):
    """A small correct DDP from scratch: broadcast at construction, all-reduce mean of every
    trained parameter at the end of backward, in registration order (replicas may fire their
    hooks in different orders). Refuses every keyword but ``broadcast_buffers``, as the README
    asks, and has no no_sync, join or register_comm_hook."""

    def __init__(self, module, broadcast_buffers=True, **kwargs):
        if kwargs:
            raise TypeError(f"MinimalDDP got unexpected keyword argument {sorted(kwargs)[0]!r}")
        super().__init__()
        self.module, self.broadcast_buffers = module, broadcast_buffers
        states = list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else [])
        for t in states:
            dist.broadcast(t.data, 0)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._queued = False
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._sync)

    def _sync(self):
        self._queued = False
        for p in self._params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()

    def forward(self, *a, **k):
        if self.broadcast_buffers and torch.is_grad_enabled():
            for b in self.module.buffers():
                dist.broadcast(b.data, 0)
        return self.module(*a, **k)


class HookOrderDDP(MinimalDDP):
    """Faulty: all-reduces each gradient in its own hook, so replicas whose hooks fire in
    different orders pair different tensors (caught once scenario.core runs for it)."""

    def _ready(self, p):
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


IMPL = f"{__name__}:MinimalDDP"


@pytest.mark.cpu
def test_refused_performance_hint_still_runs_parity_mlp(conformance_session):
    """parity.mlp passes bucket_cap_mb (a performance hint): a DDP refusing it still gets the
    case run and passed; feature.bucket_view, which requires the bucket keywords, stays
    unsupported with the refusal as its reason."""
    got = evaluate(CASES["parity.mlp"], IMPL, "cpu", 2, conformance_session, shrink=False)
    assert got and {v.status for v in got} == {"pass"}, [(v.check, v.status, v.reason) for v in got]
    got = evaluate(CASES["feature.bucket_view"], IMPL, "cpu", 2, conformance_session, shrink=False)
    assert {v.status for v in got} == {"unsupported"}
    assert "refuses keyword gradient_as_bucket_view" in got[0].reason or "bucket_cap_mb" in got[0].reason


@pytest.mark.cpu
def test_scenarios_that_use_every_parameter_run_for_a_ddp_refusing_find_unused(conformance_session):
    """scenario.core draws find_unused_parameters; a scenario whose every replica runs every
    branch does not need it, so a DDP refusing the keyword (and lacking no_sync) still gets those
    scenarios judged, and the pass says which were left out."""
    got = evaluate(CASES["scenario.core"], IMPL, "cpu", 2, conformance_session, shrink=False)
    assert got and {v.status for v in got} == {"pass"}, [(v.check, v.status, v.reason[:200]) for v in got]
    assert "unsupported corner(s) skipped" in got[0].reason and "find_unused_parameters" in got[0].reason
    # the scenarios the refusal left out are counted: the coverage is not 100 %
    from conformance.report.coverage import coverage
    left = sum(got[0].programs["left_out"].values())
    assert left and got[0].programs["run"], got[0].programs
    cov = coverage([dataclasses.replace(v, case="scenario.core") for v in got])[0]
    assert (cov.tested, cov.verdicts) == (len(got), len(got)) and cov.share < 1.0, cov.text()
    run = got[0].programs["run"]
    assert f"{run} of {run + left} generated programs run" in cov.text(), cov.text()
    assert "programs left out: unsupported: " in cov.text() and "find_unused_parameters" in cov.text(), cov.text()
    got = evaluate(CASES["scenario.core"], f"{__name__}:HookOrderDDP", "cpu", 2, conformance_session, shrink=False)
    assert "fail" in {v.status for v in got}, [(v.check, v.status, v.reason[:200]) for v in got]


def _v(impl, case, status, reason="", check="params"):
    from conformance.verdict import Verdict
    return Verdict(case=case, check=check, impl=impl, runtime="cpu", model="m", world_size=2,
                   status=status, reason=reason, family=case.split(".")[0])


def test_coverage_groups_untested_verdicts_by_cause_largest_first():
    from conformance.report.coverage import coverage
    vs = [_v("d", "parity.a", "pass"), _v("d", "parity.b", "fail"), _v("d", "feature.j", "unsupported", "d has no join()"),
          *[_v("d", f"{fam}.c{i}", "unsupported", f"d refuses keyword find_unused_parameters: TypeError {i}")
            for i, fam in enumerate(("feature", "scenario", "feature"))],
          _v("d", "scenario.w", "unsupported", "every scenario: d refuses keyword find_unused_parameters: x (plain)"),
          _v("d", "feature.s", "skip", "process subgroups need world size >= 3"), _v("e", "parity.a", "pass")]
    d, e = coverage(vs)
    assert (d.impl, d.verdicts, d.tested) == ("d", 8, 2) and abs(d.share - 0.25) < 1e-12
    assert [(c.status, c.cause, c.verdicts) for c in d.causes] == [
        ("unsupported", "refuses keyword find_unused_parameters", 4),
        ("skip", "process subgroups need world size >= 3", 1), ("unsupported", "has no join()", 1)]
    assert d.causes[0].families == ["feature", "scenario"] and len(d.causes[0].cases) == 4
    assert "2 of 8 verdicts tested (25.0 %)" in d.text() and "refuses keyword find_unused_parameters: 4" in d.text()
    assert (e.tested, e.verdicts, e.causes) == (1, 1, [])


def test_coverage_weighs_a_scenario_case_by_the_programs_it_ran():
    """A generated-scenario case that ran 2 of 14 scenarios (the DDP refused the drawn corners of
    the rest) counts 2/14 of its verdicts, and the line says how many programs were left out."""
    from conformance.report.coverage import coverage
    left = {"unsupported: d refuses keyword find_unused_parameters: TypeError x": 12}
    vs = [_v("d", "parity.a", "pass"),
          *[dataclasses.replace(_v("d", "scenario.w", "pass", check=c), programs={"run": 2, "left_out": left})
            for c in ("params", "buffers")]]
    (d,) = coverage(vs)
    assert d.tested == 3 and abs(d.share - (1 + 2 * 2 / 14) / 3) < 1e-12, d.share
    assert (d.programs_run, d.programs_left) == (2, {"unsupported: refuses keyword find_unused_parameters": 12})
    assert "3 of 3 verdicts tested, 2 of 14 generated programs run (42.9 %)" in d.text(), d.text()
    assert d.to_json()["programs"] == {"run": 2, "left_out": d.programs_left}


def test_require_supported_selects_unsupported_verdicts_by_cause():
    from conformance.report.coverage import unmet_requirements
    vs = [_v("d", "feature.j", "unsupported", "d has no join()"), _v("d", "feature.b", "unsupported",
          "d refuses keyword bucket_cap_mb: no"), _v("d", "parity.a", "pass")]
    assert [v.case for v in unmet_requirements(vs, ["join"])] == ["feature.j"]
    assert [v.case for v in unmet_requirements(vs, ["all"])] == ["feature.j", "feature.b"]
    assert unmet_requirements(vs, ["static_graph"]) == []


def test_html_label_says_how_much_a_correct_run_tested():
    from conformance.report.runs import impl_label
    assert impl_label({"pass": 3}) == "correct"
    label = impl_label({"pass": 3, "unsupported": 1})
    assert label.startswith("correct on 75.0 %") and "1 not tested" in label


@pytest.mark.cpu
def test_cli_prints_coverage_and_require_supported_exits_1(tmp_path):
    import json
    import subprocess
    import sys
    args = [sys.executable, "-m", "conformance", "run", "--ddp", "ref", "--world-size", "2", "--only",
            "feature.join", "--quiet", "--json", str(tmp_path / "r.json")]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stdout[-2000:] + plain.stderr[-2000:]
    assert "coverage ref: 0 of 1 verdicts tested (0.0 %); not tested: unsupported - has no join()" in plain.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["coverage"][0]["causes"][0]["cause"] == "has no join()" and doc["coverage"][0]["tested"] == 0
    strict = subprocess.run(args + ["--require-supported", "join"], capture_output=True, text=True, timeout=600)
    assert strict.returncode == 1, strict.stdout[-2000:] + strict.stderr[-2000:]
    assert "--require-supported join: 1 verdict(s) unsupported" in strict.stdout
