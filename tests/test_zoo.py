"""The zoo of real models (fixtures/zoo, docs/zoo.md): every model passes the kit's checks of a
user model on one device, is named in the docs with its corners, runs by name (``--model
zoo:NAME``) and in ``scenario.zoo``; an unknown name is one ``error:`` line (exit 2); a model whose
library is missing is skipped with the reason; a DDP that does not average fails on a zoo model."""
from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import subprocess
import sys

import pytest

from fixtures import zoo as zoo_pkg
from fixtures.zoo import COSTS, PREFIX, draw, unavailable, zoo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Bound on one CLI run (a run takes well under this on a quiet 2-core machine).
CLI_TIMEOUT_S = 600
NAMES = list(zoo())


def _cli(*args, json_path, profile="dev"):
    env = dict(os.environ, CONFORMANCE_PROFILE=profile)  # scenario.zoo's draw: the default profile's
    return subprocess.run([sys.executable, "-m", "conformance", "run", *args, "--json", str(json_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=CLI_TIMEOUT_S, env=env)


def test_every_family_module_declares_its_models():
    families = {m.name for m in pkgutil.iter_modules(zoo_pkg.__path__)}
    assert families == {m.family for m in zoo().values()}
    assert all(m.cost in COSTS for m in zoo().values())
    assert any(m.needs for m in zoo().values()) and any(not m.needs for m in zoo().values())


@pytest.mark.parametrize("name", NAMES)
def test_every_zoo_model_passes_the_user_model_checks(name):
    from conformance.options import parse_model
    spec = PREFIX + name
    if unavailable(spec):
        pytest.skip(unavailable(spec))
    cases, notes = parse_model(spec, [2, 3])  # build deterministic, batch, step, not random, mean loss
    assert {c.name for c in cases} == {"parity.user_model", "parity.user_model_find_unused", "scenario.user_loop"}
    assert not any("same parameters for every seed" in n for n in notes), notes


def test_every_zoo_model_is_documented_with_its_corners():
    with open(os.path.join(REPO, "docs", "zoo.md")) as f:
        doc = f.read()
    for name, m in zoo().items():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{name}` ")), None)
        assert row is not None, f"docs/zoo.md has no row for {name}"
        assert all(c in row for c in m.corners), (name, m.corners, row)
    by_corner = {}
    for name, m in zoo().items():
        for c in m.corners:
            by_corner.setdefault(c, []).append(f"`{name}`")
    for c, names in by_corner.items():  # the per-corner list says the same
        line = next((x for x in doc.splitlines() if x.startswith(f"* corner `{c}`: ")), "")
        assert sorted(line.split(": ", 1)[-1].split(", ")) == sorted(names), (c, line)


def test_the_draw_is_fixed_by_its_seed_and_cost_class():
    cheap = {PREFIX + n for n, m in zoo().items() if m.cost == 1}
    assert draw(5, 2, 1) == draw(5, 2, 1) and set(draw(5, 99, 1)) == cheap
    assert set(draw(5, 99, 3)) == {PREFIX + n for n in NAMES}
    from conformance.cases.scenario.zoo import drawn_models
    assert len(drawn_models("dev")) == 1 and drawn_models("ci-pjrt") == []


def test_a_missing_library_is_a_skip_with_the_reason(monkeypatch):
    from conformance.cases.table import CASES
    from conformance.evaluate import evaluate
    from conformance.options import parse_model
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformers" else real(n, *a))
    spec = PREFIX + "bert_tiny"
    assert "needs transformers" in unavailable(spec) and "ddp-conformance[zoo]" in unavailable(spec)
    assert unavailable(PREFIX + "lstm") is None and unavailable("linear") is None
    cases, notes = parse_model(spec, [2])  # no check on one device: the library is not there
    assert notes == [unavailable(spec)]
    vs = evaluate(next(c for c in cases if c.name == "parity.user_model"), "ref", "cpu", 2)
    assert vs and {v.status for v in vs} == {"skip"} and all("needs transformers" in v.reason for v in vs)
    assert CASES["scenario.zoo"].args == {"zoo": True}


@pytest.mark.parametrize("spec", ["zoo:no_such_model", "zoo:"])
def test_an_unknown_zoo_model_is_one_error_line_and_exit_2(tmp_path, spec):
    got = _cli("--ddp", "ref", "--model", spec, json_path=tmp_path / "r.json")
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), got.stderr
    assert "no zoo model" in lines[0] or "give package.module:factory" in lines[0], lines[0]


@pytest.mark.long
def test_a_ddp_that_does_not_average_fails_on_a_zoo_model(tmp_path):
    got = _cli("--ddp", "ref,mutant:sum_not_mean", "--model", "zoo:tied_lm", "--world-size", "2", "--only",
               "parity.user_model", json_path=tmp_path / "r.json")
    assert got.returncode == 1, got.stdout[-3000:] + got.stderr[-3000:]
    with open(tmp_path / "r.json") as f:
        params = {v["impl"]: v["status"] for v in json.load(f)["verdicts"] if v["check"] == "param_parity"}
    assert params == {"ref": "pass", "mutant:sum_not_mean": "fail"}


@pytest.mark.long
def test_scenario_zoo_runs_the_drawn_model_and_fails_a_ddp_that_skips_sync(tmp_path):
    got = _cli("--ddp", "ref,mutant:no_grad_sync", "--only", "scenario.zoo", json_path=tmp_path / "r.json")
    assert got.returncode == 1, got.stdout[-3000:] + got.stderr[-3000:]
    with open(tmp_path / "r.json") as f:
        vs = json.load(f)["verdicts"]
    params = {v["impl"]: v for v in vs if v["check"] == "params"}
    assert params["ref"]["status"] == "pass" and params["mutant:no_grad_sync"]["status"] == "fail"
    from conformance.cases.scenario.zoo import drawn_models
    assert all(drawn_models("dev")[0] in v["reason"] for v in params.values()), [v["reason"] for v in params.values()]


def test_a_model_with_sparse_gradients_runs_programs_one_device_can_run():
    import torch
    from conformance.cases.scenario.dimensions import SPARSE_OPTIMIZERS
    from conformance.cases.scenario.userloop import has_sparse_grads, user_loop_programs
    from fixtures import build_model, global_batch
    from fixtures.models import training_loss
    spec = PREFIX + "embedding_bag"
    assert has_sparse_grads(spec) and not has_sparse_grads(PREFIX + "lstm")
    dense, sparse = user_loop_programs(2, 1, 0.1), user_loop_programs(2, 1, 0.1, sparse=True)
    assert {p.optimizer for p in dense} - set(SPARSE_OPTIMIZERS) and any(p.loop["clip"] != "none" for p in dense)
    assert all(p.optimizer in SPARSE_OPTIMIZERS and p.loop["clip"] == "none" for p in sparse)
    # why: on one device, without any DDP, weight decay and clipping refuse the sparse gradient
    m = build_model(spec, 0)
    x, y = global_batch(spec, 0, 0, 24)
    training_loss(spec, m(x), y).backward()
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=0.01).step()
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
