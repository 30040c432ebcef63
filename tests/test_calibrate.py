"""``calibrate`` (noise / signal / margins) and ``run --repeat`` (flakiness sweep)."""
import json
import subprocess
import sys

import pytest

from conformance.cli.calibrate import calibrate, summary_text
from conformance.verdict import Verdict
from conformance.cases.table import CASES
from conformance.cli.parity import parity_mutants

pytestmark = pytest.mark.cpu

ATOL = 1e-5  # the linear float32 row


class FakeRunner:
    """``verdicts()`` from a table ``devs(impl, seed) -> {check: max_dev}``."""

    def __init__(self, devs):
        self.devs, self.calls = devs, []

    def verdicts(self, runtime, w, impl, model, dtype="float32", **over):
        self.calls.append((impl, over["seed"]))
        out = {}
        for check, dev in self.devs(impl, over["seed"]).items():
            out[check] = Verdict(f"parity.{model}", check, impl, runtime, model, w, "fail" if dev > ATOL else "pass",
                                 max_dev=dev, atol=ATOL, margin=ATOL / dev, per_step=[dev / 2, dev])
        return out

    def forget(self):
        pass


def table(overrides):
    def devs(impl, seed):
        if not impl.startswith("mutant:"):
            return {"param_parity": 2e-8, "loss_parity": 2e-7 if seed == 1 else 1e-7}
        name = impl[len("mutant:"):]
        return overrides.get(name, lambda seed: {"param_parity": 5e-2, "loss_parity": 1e-2})(seed)
    return devs


def test_definitions_on_a_fake_table():
    silent_then_seen = {  # clip_local_grad: the clip triggers only at seed 1
        "clip_local_grad": lambda seed: ({"param_parity": 2e-8, "loss_parity": 1e-7} if seed == 0
                                         else {"param_parity": 1e-3, "loss_parity": 1e-4}),
        "no_grad_sync": lambda seed: {"param_parity": 3e-2, "loss_parity": 2e-2},
    }
    runner = FakeRunner(table(silent_then_seen))
    memo = {}
    cal = calibrate(runner, "cpu", 2, "mlp", "ref", [0, 1], memo=memo)
    assert cal["noise"] == 2e-7 and cal["noise_at"] == {"check": "loss_parity", "seed": 1}
    assert cal["noise_by_check"] == {"param_parity": 2e-8, "loss_parity": 2e-7}
    # signal: the weakest mutant's weakest non-silent seed, its largest killing check
    assert cal["signal"] == 1e-3 and cal["signal_at"] == {"mutant": "clip_local_grad", "seed": 1,
                                                           "check": "param_parity"}
    clip = next(m for m in cal["mutants"] if m["mutant"] == "clip_local_grad")
    assert clip["silent_seeds"] == [0] and not clip.get("excluded")
    # the case table does not require parity.mlp to kill buffers_not_broadcast (nor the workload
    # corners' mutants): excluded by the table, without runs
    by_table = [m for m in parity_mutants() if m not in CASES["parity.mlp"].must_kill]
    assert "buffers_not_broadcast" in by_table
    assert [e["mutant"] for e in cal["excluded"]] == by_table
    assert cal["ok"], cal["problems"]
    assert cal["atol_over_noise"] == pytest.approx(50) and cal["signal_over_atol"] == pytest.approx(100)
    assert cal["correct"][0]["checks"]["param_parity"]["per_step"] == [1e-8, 2e-8]
    text = summary_text(cal)
    assert "noise floor  2e-07" in text and "signal       0.001" in text and "verdict: OK" in text
    # a second implementation reuses the mutants' runs
    n = len(runner.calls)
    calibrate(runner, "cpu", 2, "mlp", "torch", [0, 1], memo=memo)
    assert len(runner.calls) - n == 2 and all(i == "torch" for i, _ in runner.calls[n:])


def test_a_mutant_below_atol_fails_the_gate():
    weak = {"wrong_count": lambda seed: {"param_parity": 4e-6, "loss_parity": 1e-6}}
    cal = calibrate(FakeRunner(table(weak)), "cpu", 2, "linear", "ref", [0, 1])
    assert not cal["ok"]
    assert cal["signal"] == 4e-6 and cal["signal_at"]["mutant"] == "wrong_count"
    assert any("wrong_count survives seed 0" in p for p in cal["problems"])
    assert any(p.startswith("atol 1e-05 > signal 4e-06 / 10") for p in cal["problems"])
    assert any(p.startswith("signal/noise 20 < 100") for p in cal["problems"])


def test_a_mutant_that_never_triggers_is_excluded():
    never = {"clip_local_grad": lambda seed: {"param_parity": 3e-8, "loss_parity": 1.5e-7}}
    cal = calibrate(FakeRunner(table(never)), "cpu", 2, "mlp", "ref", [0, 1])
    assert cal["ok"], cal["problems"]
    reasons = {e["mutant"]: e["reason"] for e in cal["excluded"]}
    assert "indistinguishable from a correct run" in reasons["clip_local_grad"]
    assert len(cal["mutants"]) == len(CASES["parity.mlp"].must_kill)  # excluded (b) keeps its runs, marked


def run_cli(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "conformance", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_calibrate_cli_linear(tmp_path):
    out = tmp_path / "cal.json"
    r = run_cli("calibrate", "--runtime", "cpu", "--model", "linear", "--ddp", "ref", "--seeds", "2",
                "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "noise floor" in r.stdout and "signal" in r.stdout and "verdict: OK" in r.stdout
    doc = json.loads(out.read_text())
    (cal,) = doc["calibrations"]
    assert cal["seeds"] == [1234, 1235] and cal["atol"] == 1e-5 and cal["lr"] == 0.1
    assert cal["noise"] < 1e-6 and cal["signal"] > 1e-4
    assert cal["atol_over_noise"] >= 10 and cal["signal_over_atol"] >= 10 and cal["signal_over_noise"] >= 100
    assert {e["mutant"] for e in cal["excluded"]} >= {"buffers_not_broadcast"}
    steps = cal["correct"][0]["checks"]["param_parity"]["per_step"]
    assert len(steps) == cal["steps"] and max(steps) <= cal["noise"]


@pytest.mark.parametrize("args,needle", [
    (["--model", "resnet"], "unknown model 'resnet'"),
    (["--model", "linear", "--ddp", "mutant:no_grad_sync"], "not a mutant"),
    (["--model", "linear", "--seeds", "0"], "at least 1 seed"),
    (["--model", "linear", "--world-size", "1"], "world size >= 2"),
])
def test_calibrate_bad_input_exit_2(args, needle):
    r = run_cli("calibrate", *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


@pytest.mark.long
def test_repeat_passes_for_a_correct_implementation(tmp_path):
    out = tmp_path / "repeat.json"
    r = run_cli("run", "--ddp", "ref", "--only", "linear", "--repeat", "3", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3/3 repetitions" in r.stdout and "no flakiness seen" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["completed"] == 3 and not doc["failures"]
    assert {c["check"]: c["statuses"] for c in doc["cells"]} == {"param_parity": {"pass": 3},
                                                                  "loss_parity": {"pass": 3}}


def test_repeat_reports_a_failing_implementation(tmp_path):
    r = run_cli("run", "--ddp", "conformance.impls.mutants.refmutants:NoGradSync", "--only", "linear", "--world-size", "2", "--repeat", "2",
                "--json", str(tmp_path / "r.json"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT PASSING at seed 1234" in r.stdout and "NOT PASSING at seed 1235" in r.stdout
    assert "4 non-passing verdict(s)" in r.stdout


def test_repeat_refuses_mutants(tmp_path):
    r = run_cli("run", "--ddp", "mutant:no_grad_sync", "--repeat", "2", cwd=tmp_path)  # the default report's lock
    assert r.returncode == 2 and "is a mutant" in r.stderr
