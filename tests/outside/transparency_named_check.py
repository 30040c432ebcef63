"""Own sanity check of tests/outside/transparency_named.py against torch's DistributedDataParallel.

Two processes (gloo, CPU), torch.multiprocessing; every spawn is joined with a timeout and killed
after it. For each class (and torch's DDP as the baseline) three user-observable scenarios run:

* ``exact_bucket``: Linear(16,16,bias=False) x 2 (1024 bytes each), ``bucket_cap_mb`` = 1024 bytes
  exactly; 3 SGD steps on rank-dependent data; max |param - torch's param| over ranks, and the
  replica disagreement (max |rank1 - rank0|);
* ``below_cap_bucket``: the same with a 500-byte cap (control: no bucket is exactly full);
* ``prebuilt_optimizer``: the optimizer is built on ``model.parameters()`` BEFORE wrapping; 3 SGD
  steps; max |param - torch's param| (the parameters the wrapper's module holds);
* ``dropout``: per-rank seed ``torch.manual_seed(100 + rank)`` before wrapping, then a dropout
  mask on ``ones(1000)``; fraction of mask entries that differ from torch's (rank 1) and the
  fraction that differ between rank 0 and rank 1.

Prints one JSON line per class. Run: ``python tests/outside/transparency_named_check.py``.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

CLASSES = ["TransparentDDP", "ExactBucketDropDDP", "ParamSwapDDP", "RngSyncDDP"]
TIMEOUT_S = 120


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cls(name):
    if name == "torch":
        return nn.parallel.DistributedDataParallel
    from tests.outside import transparency_named as tn
    return getattr(tn, name)


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 16, bias=False), nn.Tanh(), nn.Linear(16, 16, bias=False))


def _data(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)


def _train(ddp, opt, steps=3):
    for s in range(steps):
        x, y = _data(dist.get_rank(), s)
        opt.zero_grad()
        loss = ((ddp(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])


def _worker(rank, world, port, name, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cls = _cls(name)
        res = {}
        # exact-full bucket cap: each Linear weight is 16*16*4 = 1024 bytes
        m = _model(rank)  # rank-dependent init: the construction broadcast must fix it
        ddp = cls(m, bucket_cap_mb=1024 / 2**20)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
        res["exact_bucket"] = _train(ddp, opt)
        # control: a cap below a parameter's size (buckets larger than the cap): no exact fill
        m = _model(rank)
        ddp = cls(m, bucket_cap_mb=500 / 2**20)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
        res["below_cap_bucket"] = _train(ddp, opt)
        # optimizer built before wrapping
        m = _model(rank)
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
        ddp = cls(m)
        res["prebuilt_optimizer"] = _train(ddp, opt)
        # dropout masks, seeded per rank before wrapping
        torch.manual_seed(100 + rank)
        m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
        ddp = cls(m)
        res["dropout"] = (m[1](torch.ones(1000)) != 0).to(torch.float32)
        torch.save(res, os.path.join(out_dir, f"{name}_{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _run(name, out_dir, world=2):
    ctx = mp.spawn(_worker, args=(world, _free_port(), name, out_dir), nprocs=world,
                   join=False)
    import time
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: world did not finish in {TIMEOUT_S}s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return [torch.load(os.path.join(out_dir, f"{name}_{r}.pt")) for r in range(world)]


def main():
    with tempfile.TemporaryDirectory() as d:
        base = _run("torch", d)
        for name in CLASSES:
            line = {"class": name}
            try:
                got = _run(name, d)
            except Exception as e:  # noqa: BLE001
                line["error"] = f"{type(e).__name__}: {e}"
                print(json.dumps(line), flush=True)
                continue
            for key in ("exact_bucket", "below_cap_bucket", "prebuilt_optimizer"):
                line[f"{key}_max_abs_diff_vs_torch"] = max(
                    float((got[r][key] - base[r][key]).abs().max()) for r in range(2))
                line[f"{key}_replica_disagreement"] = float(
                    (got[1][key] - got[0][key]).abs().max())
            line["dropout_mask_frac_diff_vs_torch"] = max(
                float((got[r]["dropout"] != base[r]["dropout"]).float().mean()) for r in range(2))
            line["dropout_mask_frac_diff_rank0_vs_rank1"] = float(
                (got[1]["dropout"] != got[0]["dropout"]).float().mean())
            line["torch_dropout_mask_frac_diff_rank0_vs_rank1"] = float(
                (base[1]["dropout"] != base[0]["dropout"]).float().mean())
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
