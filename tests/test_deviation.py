"""Verdicts name the deviation: the tensor, its shape, the flat index, how much is out of
bound; NaN/Inf said as such (a fail, never vacuous); steps 1-based; the table prints a
readable first sentence, the JSON and the failures file the rest.

The outside-in test runs the main command on DDPs written here from scratch on
torch.distributed (no kit code), in a subprocess.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conformance.cases.shared.checks import CHECKS, judge, judge_agreement
from conformance.report.text import first_sentence, text_table
from conformance.tolerances import lookup

pytestmark = pytest.mark.cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Three DDPs on torch.distributed only: biases never all-reduced; gradients NaN from the
# third step on; replica 1 raising in the second training forward.
OUTSIDE_DDPS = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from torch import nn


    class NoBiasReduceDDP(nn.Module):
        """Broadcasts at construction, averages gradients - except of parameters named *bias."""

        def __init__(self, module, broadcast_buffers=True, bucket_cap_mb=None):
            super().__init__()
            self.module, self.broadcast_buffers = module, broadcast_buffers
            self.world = dist.get_world_size()
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, 0)
            for name, p in module.named_parameters():
                if p.requires_grad and not self.skip(name):
                    p.register_post_accumulate_grad_hook(self._average)

        def skip(self, name):
            return name.endswith("bias")

        def _average(self, p):
            dist.all_reduce(p.grad)
            p.grad.div_(self.world)

        def forward(self, *args, **kwargs):
            if self.broadcast_buffers and torch.is_grad_enabled():
                for b in self.module.buffers():
                    dist.broadcast(b.data, 0)
            return self.module(*args, **kwargs)


    class NaNFromStep3DDP(NoBiasReduceDDP):
        """Every gradient averaged; from the third backward on, they are NaN."""

        def skip(self, name):
            return False

        def forward(self, *args, **kwargs):
            self.calls = getattr(self, "calls", 0) + 1
            return super().forward(*args, **kwargs)

        def _average(self, p):
            super()._average(p)
            if self.calls >= 3:
                p.grad.fill_(float("nan"))


    class RaisesInStep2DDP(NaNFromStep3DDP):
        """Correct, but replica 1 raises in its second training forward."""

        def forward(self, *args, **kwargs):
            if getattr(self, "calls", 0) == 1 and dist.get_rank() == 1:
                raise ValueError("replica 1 gives up")
            return super().forward(*args, **kwargs)

        def _average(self, p):
            NoBiasReduceDDP._average(self, p)
''')

BIAS_NAMED = re.compile(r"'([\w.]*bias)' \[\d+\] at flat index \d+")


@pytest.fixture(scope="module")
def outside_run(tmp_path_factory):
    """``(json report, stdout, failures text)`` of ``run`` over the three float32 parity models on the three DDPs."""
    d = tmp_path_factory.mktemp("outside")
    (d / "scratch_ddps.py").write_text(OUTSIDE_DDPS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(d), ROOT]))
    ddps = ",".join(f"scratch_ddps:{c}" for c in ("NoBiasReduceDDP", "NaNFromStep3DDP", "RaisesInStep2DDP"))
    r = subprocess.run([sys.executable, "-m", "conformance", "run", "--runtime", "cpu", "--ddp", ddps,
                        "--world-size", "2", "--only", "parity.linear,parity.mlp,parity.batchnorm", "--json", str(d / "r.json")],
                       capture_output=True, text=True, timeout=600, cwd=d, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    failures = d / "r.failures.txt"
    return (json.loads((d / "r.json").read_text()), r.stdout,
            failures.read_text() if failures.exists() else "")


def _verdicts(doc, cls):
    return [v for v in doc["verdicts"] if v["impl"] == f"scratch_ddps:{cls}"]


def test_bias_never_reduced_is_named(outside_run):
    doc, stdout, failures = outside_run
    vs = _verdicts(doc, "NoBiasReduceDDP")
    named = [v for v in vs if v["check"] in ("param_parity", "agreement")]
    assert len(named) == 6 and all(v["status"] == "fail" for v in named), [v["id"] for v in named]
    for v in named:
        # the worst entry of the first bad step is a bias, at step 1 (agreement: replica 1 vs 0)
        assert BIAS_NAMED.search(first_sentence(v["reason"])), v["reason"]
        assert "from step 1" in v["reason"] and v["first_bad_step"] == 1, v
        assert v["replica"] == (1 if v["check"] == "agreement" else 0), v
        assert re.search(r"\d+ of \d+ tensors \(\d+ of \d+ values\)", v["reason"]), v["reason"]
    # the table prints each reason's first sentence, naming the bias; the failures file the rest
    rows = [ln for ln in stdout.splitlines() if "scratch_ddps:NoBiasReduceDDP" in ln
            and (" param_parity " in ln or " agreement " in ln)]
    assert len(rows) == 6 and all(BIAS_NAMED.search(ln) for ln in rows), "\n".join(rows)
    parity = next(v for v in named if v["check"] == "param_parity")
    assert parity["reason"] in failures and "replica 1:" in failures, failures[:2000]


def test_nan_is_said_and_fails(outside_run):
    doc, _, _ = outside_run
    vs = _verdicts(doc, "NaNFromStep3DDP")
    assert not [v["id"] for v in vs if v["status"] == "vacuous"]
    for v in vs:
        if v["check"] in ("param_parity", "agreement"):
            assert v["status"] == "fail" and v["first_bad_step"] == 3, v
            assert re.match(r"replica \d has NaN in '[\w.]+' \[[\d, ]+\] at flat index \d+ from step 3\.",
                            v["reason"]), v["reason"]


def test_replica_failure_step_is_one_based(outside_run):
    doc, _, _ = outside_run
    v = _verdicts(doc, "RaisesInStep2DDP")[0]
    assert v["status"] == "fail" and "replica 1 gives up" in v["diagnosis"], v
    assert v["replicas"][1]["step"] == 2 and "step 2, phase forward" in v["diagnosis"], v["diagnosis"][:2000]


# --- unit tests: synthetic trajectories, no world ---------------------------------------

LAYOUT = [("fc.weight", (2, 3)), ("fc.bias", (2,))]


def _replica(params, optim=None):
    params = np.asarray(params, dtype=np.float32)
    return {"params": params, "losses": np.zeros(len(params) - 1), "buffers": np.zeros((len(params), 0)),
            "optim": np.zeros(0) if optim is None else optim, "optim_digests": [],
            "layout": {"params": LAYOUT, "buffers": [], "optim": []}}


def _trajectory(steps=4, lr=0.1):
    return np.stack([np.arange(8, dtype=np.float32) * (1 - lr * s) for s in range(steps + 1)])


def test_nan_wording_in_parity_and_agreement():
    ref = _replica(_trajectory())
    nan = _trajectory()
    nan[3:, 1] = np.nan  # 'fc.weight' element 1 NaN after step 3, on every replica
    reps = [_replica(nan), _replica(nan)]
    v = judge(CHECKS["param_parity"], reps, ref, lookup("cpu", "linear"), case="c", impl="i", runtime="cpu",
              model="linear")
    assert v.status == "fail" and v.first_bad_step == 3 and v.replica == 0, v
    assert v.reason.startswith("replica 0 has NaN in 'fc.weight' [2, 3] at flat index 1 from step 3."), v.reason
    a = judge_agreement(reps, case="c", impl="i", runtime="cpu", model="linear")
    assert a.status == "fail" and a.first_bad_step == 3, a  # not vacuous: the replicas agree on NaN
    assert a.reason.startswith("replica 0 has NaN in 'fc.weight' [2, 3] at flat index 1 from step 3."), a.reason
    assert "Replica(s) 1 too" in a.reason and "vacuous" not in a.reason and "inf" not in a.reason


def test_deviation_names_tensor_shape_index_and_counts():
    ref = _replica(_trajectory())
    off = _trajectory()
    off[2:, 7] += 0.5  # 'fc.bias' element 1 from step 2
    off[3:, 0] += 0.1  # 'fc.weight' element 0 from step 3
    reps = [_replica(_trajectory()), _replica(off)]
    v = judge(CHECKS["param_parity"], reps, ref, lookup("cpu", "linear"), case="c", impl="i", runtime="cpu",
              model="linear")
    assert (v.first_bad_step, v.replica) == (2, 1)
    assert v.reason.startswith("replica 1's 'fc.bias' [2] at flat index 1 deviates from the reference by 0.5 "
                               "from step 2"), v.reason
    assert "At step 2, replica 1: 1 of 2 tensors (1 of 8 values) out of bound: 'fc.bias'." in v.reason
    assert "'fc.weight' [2, 3]: from step 3" in v.diagnosis, v.diagnosis
    a = judge_agreement(reps, case="c", impl="i", runtime="cpu", model="linear")
    assert a.reason.startswith("replica 1's 'fc.bias' [2] at flat index 1 differs from replica 0's by 0.5 "
                               "from step 2"), a.reason


def test_first_sentence_never_cuts_a_word():
    short = "world size 1 < 2: nothing is synchronised"
    assert first_sentence(short) == short
    text = ("replica 1's 'linear.bias' [10] at flat index 3 deviates from the reference by 0.0312 from "
            "step 1 (bound there 1.02e-05). At step 1, replica 1: 1 of 2 tensors (10 of 110 values) out of bound.")
    head = first_sentence(text, 120)
    assert head == text.split(". ")[0] + ". ...", head  # "1.02e-05" and "linear.bias" end no sentence
    for width in range(5, 130, 3):
        out = first_sentence(text, width)
        body = out[:-len(" ...")] if out.endswith(" ...") else out
        # a prefix of the text that ends where a word ends
        assert text.startswith(body) and not text[len(body)].isalnum(), (width, out)
        assert len(out) <= max(width, len(text.split()[0])) + len(" ..."), (width, out)
    table = text_table([{"check": "param_parity", "reason": text}])
    assert table.splitlines()[1].endswith("(bound there 1.02e-05). ..."), table


def _grad_check(reps_absent):
    from conformance.cases.shared.checks import Check
    return Check("grads", "grads", lambda reps, ref: (np.stack([r["grads"][None] for r in reps]), ref[None]),
                 lambda t: (t.atol, t.rtol), layout=lambda reps: reps[0]["layout"], when="once",
                 movement=lambda ref: 1.0, nan_is_absent=True, absent=reps_absent)


def test_a_none_gradient_is_said_missing_not_nan():
    """A ``None`` gradient reads as NaN for the comparison; the reason says it is missing (a DDP
    that left ``.grad`` None), and a real NaN gradient is still said as NaN."""
    layout = [("branch.weight", (2, 2)), ("head.bias", (2,))]
    ref = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    none = np.array([np.nan] * 4 + [0.5, 0.6])
    reps = [{"grads": ref.copy(), "layout": layout, "grads_none": np.zeros(6, bool)},
            {"grads": none, "layout": layout, "grads_none": np.array([True] * 4 + [False] * 2)}]
    absent = _grad_check(lambda rs: np.stack([r["grads_none"][None] for r in rs]))
    v = judge(absent, reps, ref, lookup("cpu", "linear"), case="c", impl="i", runtime="cpu", model="m")
    assert v.status == "fail" and v.replica == 1, v
    assert v.reason.startswith("replica 1's 'branch.weight' [2, 2] at flat index 0 is missing (None: no "
                               "gradient) where the reference has 0.1."), v.reason
    assert "NaN" not in v.reason and "(4 of them None)" in v.reason, v.reason
    assert "'branch.weight' [2, 2]: 4 of 4 values, missing (None)" in v.diagnosis, v.diagnosis
    reps[1]["grads_none"][:] = False  # the same values from a DDP that wrote NaN
    v = judge(absent, reps, ref, lookup("cpu", "linear"), case="c", impl="i", runtime="cpu", model="m")
    assert v.reason.startswith("replica 1 has NaN in 'branch.weight' [2, 2] at flat index 0"), v.reason


def test_a_ddp_leaving_an_unused_gradient_none_is_told_missing(conformance_session):
    """From outside: a DDP that writes the reduced gradient only where the replica already held
    one leaves the branch replica 1 skipped at ``None``; feature.unused_parameters says so."""
    from conformance.cases.table import CASES
    from conformance.evaluate import evaluate
    got = evaluate(CASES["feature.unused_parameters"], "tests.outside.grad_left_none:GradLeftNoneDDP", "cpu", 2,
                   conformance_session, shrink=False)
    bad = [v for v in got if v.status == "fail"]
    assert bad, [(v.check, v.status) for v in got]
    assert "is missing (None: no gradient)" in bad[0].reason and "NaN" not in bad[0].reason, bad[0].reason
