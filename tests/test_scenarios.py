"""Generated scenarios: the data format, the oracle's DDP semantics, replay, bad input."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conformance.cases.scenario.dimensions import BRANCHES
from conformance.cases.scenario.explicit import explicit_scenarios
from conformance.cases.scenario.format import Scenario, ScenarioError
from conformance.cases.scenario.generate import Space
from conformance.cases.scenario.oracle import scenario_reference

pytestmark = pytest.mark.cpu


def one_step(batch, plans, **kw):
    base = dict(seed=3, lr=0.1, optimizer="sgd", ddp={"find_unused_parameters": True, "broadcast_buffers": True},
                rebind_buffers=False, loss_scale_log2=0, checkpoint_at=None,
                steps=[{"micro": [{"batch": b, "plan": p} for b, p in zip(batch, plans)]}])
    base.update(kw)
    return Scenario(**base)


def test_json_round_trip_and_validation():
    for w in (2, 3, 5):
        for sc in explicit_scenarios(w, Space()) + explicit_scenarios(w, Space(rank_uniform=True)):
            assert Scenario.from_json(json.loads(json.dumps(sc.to_json()))) == sc
            assert sc.world_size == w
    bad = one_step([[2, 2]], [[list(BRANCHES)] * 2]).to_json()
    with pytest.raises(ScenarioError, match="unknown scenario dimension"):
        Scenario.from_json(dict(bad, warp_drive=True))
    with pytest.raises(ScenarioError, match="unknown DDP keyword"):
        Scenario.from_json(dict(bad, ddp={"bucket_magic": 1}))
    with pytest.raises(ScenarioError, match="local batch sizes"):
        Scenario.from_json(dict(bad, steps=[{"micro": [{"batch": [0, 2], "plan": [[], []]}]}]))


def test_oracle_averages_local_means_not_the_global_batch():
    """Uneven shards: DDP's gradient is the equal average of the replicas' local-mean
    gradients; the oracle's first step must equal that, and differ from the
    global-batch gradient (what a batch-weighted DDP computes)."""
    import torch
    import torch.nn.functional as F

    from conformance.cases.scenario.model import build_scenario_model, scenario_batch
    sc = one_step([[5, 1]], [[list(BRANCHES)] * 2])
    ref = scenario_reference(sc)
    net = build_scenario_model(sc.seed, False)
    xs = [scenario_batch(sc.seed, 0, 0, r, n) for r, n in enumerate([5, 1])]
    grads = []
    for x, y in xs:
        net.zero_grad()
        F.mse_loss(net(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    p0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    equal = (p0 - sc.lr * (grads[0] + grads[1]) / 2).numpy()
    weighted = (p0 - sc.lr * (5 * grads[0] + grads[1]) / 6).numpy()
    assert np.max(np.abs(ref["params"][1] - equal)) < 1e-7
    assert np.max(np.abs(ref["params"][1] - weighted)) > 1e-3


def test_oracle_keeps_accumulated_gradients_of_branches_unused_in_the_synced_step():
    sc = one_step([[2, 2], [2, 2]], [[list(BRANCHES)] * 2, [["a"]] * 2])
    ref = scenario_reference(sc)
    moved = np.abs(ref["params"][1] - ref["params"][0])
    assert moved.max() > 1e-3
    # every parameter moved: branches b and c got their no_sync micro-step gradient
    sc_never = one_step([[2, 2], [2, 2]], [[["a"]] * 2, [["a"]] * 2])
    ref_never = scenario_reference(sc_never)
    assert np.sum(np.abs(ref_never["params"][1] - ref_never["params"][0]) > 0) < np.sum(moved > 0)


def run_cli(*args, cwd, timeout=600):
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("content,needle", [("{not json", "not JSON"),
                                            ('{"seed": 1, "warp": 2}', "unknown scenario dimension")])
def test_replay_bad_file_one_line_exit_2(tmp_path, content, needle):
    f = tmp_path / "s.json"
    f.write_text(content)
    r = run_cli("replay", str(f), "--ddp", "torch", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


@pytest.mark.long
def test_replay_reruns_a_scenario(tmp_path):
    sc = one_step([[3, 1]], [[list(BRANCHES)] * 2])
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"scenario": sc.to_json()}))
    ok = run_cli("replay", str(f), "--ddp", "torch", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = run_cli("replay", str(f), "--ddp", "mutant:batch_weighted", "--json", "replay.json", cwd=tmp_path)
    assert bad.returncode == 1 and "uneven local batches [3, 1]" in bad.stdout, bad.stdout + bad.stderr
    # the same report as run: the JSON with every verdict's full reason, and the failures file
    doc = json.loads((tmp_path / "replay.json").read_text())
    failing = [v for v in doc["verdicts"] if v["status"] == "fail"]
    assert doc["kind"] == "run" and doc["replay"] == str(f) and failing, doc["verdicts"]
    failures = (tmp_path / "replay.failures.txt").read_text()
    assert all(v["id"] in failures and v["reason"] in failures for v in failing)
    assert f"reproduce: python -m conformance replay {f} --ddp mutant:batch_weighted --runtime cpu" in failures


@pytest.mark.long
def test_failing_scenario_case_writes_a_replayable_minimal_scenario(tmp_path):
    r = run_cli("run", "--ddp", "mutant:replica_drift", "--world-size", "2", "--only", "scenario.core", "--quiet", "--json",
                str(tmp_path / "r.json"), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    (agree,) = [v for v in doc["verdicts"] if v["check"] == "agreement"]
    assert agree["status"] == "fail" and agree["replica"] == 1 and agree["first_bad_step"] == 2
    files = list(tmp_path.glob("r.scenario.core-*.json"))
    assert len(files) == 1
    sc = Scenario.from_json(json.loads(files[0].read_text()))
    assert len(sc.steps) == 2  # shrunk: the drift starts at the second step
    again = run_cli("replay", str(files[0]), "--ddp", "mutant:replica_drift", cwd=tmp_path)
    assert again.returncode == 1 and "agreement" in again.stdout


def test_a_sibling_too_small_to_judge_on_the_minimal_scenario_is_judged_elsewhere():
    """Issue 29 item 4: shrinking keeps what fails, not what trains; a sibling check vacuous on
    the minimal failing scenario takes its verdict over the passing scenarios, else the unshrunk
    failing scenario's, and stays vacuous only when neither judged it."""
    from conformance.cases.scenario.generate import judged_on
    from conformance.verdict import Verdict

    def vs(**status):
        return [Verdict("", c, "", "", "scenario", 2, st, max_dev=0.1) for c, st in status.items()]
    minimal, first = object(), object()
    got = judged_on(minimal, vs(params="vacuous", buffers="fail", agreement="vacuous"), first,
                    vs(params="pass", buffers="fail", agreement="vacuous"),
                    {"params": vs(params="pass")[0]}, 7)
    assert [(v.check, v.status, on) for v, on in got] == [
        ("params", "pass", None), ("buffers", "fail", minimal), ("agreement", "vacuous", minimal)]
    assert got[0][0].reason.startswith("7 scenario(s) judged")
    got = judged_on(minimal, vs(params="vacuous", buffers="fail"), first, vs(params="pass", buffers="fail"), {}, 0)
    assert [(v.check, v.status, on) for v, on in got] == [("params", "pass", first), ("buffers", "fail", minimal)]
