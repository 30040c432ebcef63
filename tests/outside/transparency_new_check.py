"""Sanity check of tests/outside/transparency_new.py against torch's own DistributedDataParallel.

For each class, a 2-process gloo world (torch.multiprocessing, bounded by a timeout) runs the same
user-visible probes twice, once wrapped in torch's DDP and once in the class, and rank 0 prints one
JSON line: what each probe measured under both, and which probes differ. A correct DDP differs in
none; each faulty one should differ in its own probe.

    python tests/outside/transparency_new_check.py [Class ...]      (from /work/main)
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.outside import transparency_new as tn  # noqa: E402

CLASSES = [
    "TransparentDDP",
    "RngConsumingDDP",
    "UnfreezeDDP",
    "TrainModeDDP",
    "StateDictPrefixDDP",
    "UserHookBypassDDP",
    "OutputCopyDDP",
]
TIMEOUT_S = 120
Out = collections.namedtuple("Out", ["pred", "aux"])


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def probe_rng(wrap, rank):
    """Dropout masks drawn after wrapping, and the default generator's state afterwards."""
    torch.manual_seed(100 + rank)
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
    ddp = wrap(m)
    torch.manual_seed(7 + rank)
    x = torch.ones(16, 8)
    masks = [(ddp(x) == 0).flatten() for _ in range(3)]
    return {"mask": torch.cat(masks).tolist(), "rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]}


def probe_freeze(wrap, rank):
    """A layer frozen before wrapping: does it move in one SGD step?"""
    m = _mlp(1 + rank)
    m[0].requires_grad_(False)
    before = m[0].weight.detach().clone()
    ddp = wrap(m, find_unused_parameters=True)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    torch.manual_seed(11 + rank)
    ddp(torch.randn(4, 6)).pow(2).mean().backward()
    opt.step()
    return {
        "frozen_requires_grad": bool(m[0].weight.requires_grad),
        "frozen_moved": float((m[0].weight.detach() - before).abs().max()),
    }


def probe_mode(wrap, rank):
    """A teacher wrapped in eval mode (BatchNorm + Dropout), used under no_grad."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Dropout(0.5))
    m.eval()
    ddp = wrap(m)
    rm = m[1].running_mean.clone()
    torch.manual_seed(5 + rank)
    x = torch.randn(8, 6)
    with torch.no_grad():
        y1, y2 = ddp(x), ddp(x)
    return {
        "training_after_wrap": bool(m.training),
        "running_mean_moved": float((m[1].running_mean - rm).abs().max()),
        "two_forwards_differ": bool((y1 != y2).any()),
    }


def probe_state_dict(wrap, rank):
    """state_dict keys; a torch-DDP checkpoint loaded strictly into the wrapper, and back."""
    mt, mc = _mlp(1), _mlp(2)
    t = TorchDDP(mt)
    c = wrap(mc)
    keys = sorted(c.state_dict().keys())
    res = {"keys": keys}
    try:
        c.load_state_dict(t.state_dict(), strict=True)
        res["load_torch_ckpt"] = "ok"
        res["loaded_equal"] = bool(torch.equal(mc[0].weight, mt[0].weight))
    except Exception as e:  # noqa: BLE001
        res["load_torch_ckpt"] = type(e).__name__ + ": " + str(e).splitlines()[0][:120]
    try:
        TorchDDP(_mlp(3)).load_state_dict(c.state_dict(), strict=True)
        res["torch_loads_ckpt"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["torch_loads_ckpt"] = type(e).__name__ + ": " + str(e).splitlines()[0][:120]
    return res


def probe_hook(wrap, rank):
    """A gradient-scaling hook registered on a parameter after wrapping."""
    m = _mlp(1)
    ddp = wrap(m)
    m[0].weight.register_hook(lambda g: g * 0.5)
    torch.manual_seed(21 + rank)
    ddp(torch.randn(5, 6) * (rank + 1)).pow(2).mean().backward()
    return {"w0_grad_sum": float(m[0].weight.grad.sum()), "w2_grad_sum": float(m[2].weight.grad.sum())}


class NamedOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 2)

    def forward(self, x):
        y = self.lin(x)
        return Out(pred=y[:, :1], aux=y[:, 1:].detach())


def probe_output(wrap, rank):
    """A module returning a namedtuple: what the user's loop receives."""
    torch.manual_seed(0)
    ddp = wrap(NamedOut())
    out = ddp(torch.randn(3, 6))
    try:
        out.pred.sum().backward()
        attr = "ok"
    except Exception as e:  # noqa: BLE001
        attr = type(e).__name__ + ": " + str(e)[:80]
    return {"output_type": type(out).__name__, "out.pred": attr}


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(6, 8)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x, use_b=True):
        self.count += x.shape[0]
        h = torch.tanh(self.stem(x))
        h = self.a(h) + (self.b(h) if use_b else 0)
        return self.head(h)


def probe_parity(wrap, rank):
    """Uneven batches, a rank-dependent unused branch, a no_sync window, SGD+momentum, 3 steps."""
    torch.manual_seed(40 + rank)
    m = Branchy()
    ddp = wrap(m, find_unused_parameters=True, bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(9 + rank)
    for step in range(3):
        opt.zero_grad()
        with ddp.no_sync():
            ddp(torch.randn(2 + rank, 6, generator=g), use_b=(rank == 0)).pow(2).mean().backward()
        ddp(torch.randn(3 + 2 * rank, 6, generator=g), use_b=(step != 1)).pow(2).mean().backward()
        opt.step()
    return {"params": [p.detach().flatten().tolist() for p in m.parameters()],
            "count": m.count.tolist()}


PROBES = {
    "rng": probe_rng,
    "freeze": probe_freeze,
    "mode": probe_mode,
    "state_dict": probe_state_dict,
    "hook": probe_hook,
    "output": probe_output,
    "parity": probe_parity,
}


def _diff(name, a, b):
    """A short measured difference between the torch run (a) and the class run (b)."""
    if name == "rng":
        ma, mb = a["mask"], b["mask"]
        frac = sum(x != y for x, y in zip(ma, mb)) / len(ma)
        return {"mask_elements_differing": round(frac, 3), "rng_state_equal": a["rng"] == b["rng"]}, (
            frac > 0 or a["rng"] != b["rng"]
        )
    if name == "parity":
        d = max(abs(x - y) for pa, pb in zip(a["params"], b["params"]) for x, y in zip(pa, pb))
        return {"max_abs_param_diff": d, "count_equal": a["count"] == b["count"]}, (
            d > 1e-6 or a["count"] != b["count"]
        )
    diff = {k: {"torch": a[k], "class": b.get(k)} for k in a if a[k] != b.get(k)}
    if name == "hook" and diff:
        diff["ratio_w0_class_over_torch"] = round(b["w0_grad_sum"] / a["w0_grad_sum"], 4)
    if name == "state_dict" and "keys" in diff:
        diff["keys"] = {"torch": a["keys"][:2], "class": b["keys"][:2]}
    return diff, bool(diff)


def _worker(rank, cls_name, port, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        cls = getattr(tn, cls_name)

        def torch_wrap(m, **kw):
            return TorchDDP(m, **kw)

        def cls_wrap(m, **kw):
            return cls(m, **kw)

        result = {"class": cls_name, "probes": {}, "differs": []}
        for name, fn in PROBES.items():
            a = fn(torch_wrap, rank)
            try:
                b = fn(cls_wrap, rank)
            except Exception as e:  # noqa: BLE001
                result["probes"][name] = {"error": type(e).__name__ + ": " + str(e)[:160]}
                result["differs"].append(name)
                continue
            d, differs = _diff(name, a, b)
            result["probes"][name] = d if differs else "same"
            if differs:
                result["differs"].append(name)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_one(cls_name, port):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    os.unlink(path)
    ctx = mp.start_processes(_worker, args=(cls_name, port, path), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    ok = False
    try:
        while time.monotonic() < deadline:
            if ctx.join(timeout=1):
                ok = True
                break
    except Exception as e:  # noqa: BLE001  (a replica raised)
        return {"class": cls_name, "error": type(e).__name__ + ": " + str(e)[-300:]}
    if not ok:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(5)
        return {"class": cls_name, "error": f"timeout after {TIMEOUT_S} s"}
    with open(path) as f:
        res = json.load(f)
    os.unlink(path)
    return res


def main(argv):
    names = argv or CLASSES
    for k, name in enumerate(names):
        res = run_one(name, 29700 + k)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
