"""Show that each faulty DDP deviates from torch's DDP in its situation and matches it in ordinary
use: two processes (torch.multiprocessing + gloo), replicas built from different seeds, 3 SGD
steps on rank-dependent data; the final state_dict (parameters and buffers) of every rank is
compared with torch.nn.parallel.DistributedDataParallel's.

usage: python tests/outside/structure_demo.py   (writes demo_results.json)
"""
import importlib
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

W = 2
STEPS = 3


# ------------------------------------------------------------------ models (situations)
class MLP(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


class MLPBN(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))


class AttnNet(nn.Module):  # nn.MultiheadAttention: out_proj used functionally, None slots
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        return self.head(a.mean(1))


class TokenNet(nn.Module):  # a parameter on the wrapped module itself (cls token / logit scale)
    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.randn(8))
        self.body = MLP()

    def forward(self, x):
        return self.body(x + self.cls_token)


class MaskShiftNet(nn.Module):  # multi-input forward with optional positional inputs
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x, mask=None, shift=None):
        h = self.lin(x)
        if mask is not None:
            h = h * mask
        if shift is not None:
            h = h + shift
        return self.head(torch.relu(h))


class QKVNet(nn.Module):  # q/k/v loaded as views of one fused checkpoint tensor
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8, bias=False)
        self.k = nn.Linear(8, 8, bias=False)
        self.v = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 1)
        fused = torch.randn(24, 8) * 0.3          # "checkpoint": one fused qkv tensor
        sd = self.state_dict()
        sd["q.weight"], sd["k.weight"], sd["v.weight"] = fused.chunk(3)
        self.load_state_dict(sd, assign=True)

    def forward(self, x):
        return self.head(self.q(x) * self.k(x) + self.v(x))


class BigEmbNet(nn.Module):  # a 52000 x 128 float32 embedding (26.6 MB > 25 MiB)
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(52000, 128)
        self.head = nn.Linear(128, 1)

    def forward(self, idx):
        return self.head(self.emb(idx))


class LazyNet(nn.Sequential):
    def __init__(self):
        super().__init__(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.bn = nn.BatchNorm1d(16)

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x)))


class NestedBNNet(nn.Module):  # BatchNorm two levels down (block.bn)
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.block = Block()
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.block(self.stem(x)))


def batch_x(rank, step, shape=(4, 8)):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(*shape, generator=g), torch.randn(shape[0], 1, generator=g)


def batches(case, rank, step):
    """-> (args, kwargs, target)"""
    if case == "attn":
        x, y = batch_x(rank, step, (4, 5, 8))
        return (x,), {}, y
    if case == "mask_shift":
        x, y = batch_x(rank, step)
        shift = torch.randn(4, 8, generator=torch.Generator().manual_seed(7 + rank + 10 * step))
        return (x, None, shift), {}, y
    if case == "big_emb":
        g = torch.Generator().manual_seed(1000 * rank + step)
        idx = torch.cat([torch.randint(0, 52000, (8,), generator=g),
                         torch.randint(51300, 52000, (8,), generator=g)])  # rows past 25 MiB
        return (idx,), {}, torch.randn(16, 1, generator=g)
    x, y = batch_x(rank, step)
    return (x,), {}, y


CASES = {  # case -> model builder
    "mlp": MLP, "linear_root": lambda: nn.Linear(8, 1), "mlp_bn": MLPBN, "attn": AttnNet, "root_param": TokenNet,
    "mask_shift": MaskShiftNet, "qkv_views": QKVNet, "big_emb": BigEmbNet,
    "lazy": LazyNet, "lazy_after_dry_run": LazyNet, "nested_bn": NestedBNNet,
}

IMPLS = ["torch", "structure_control:DDP", "structure_faults:UnrunSubmoduleDDP", "structure_faults:RootParamsDDP",
         "structure_faults:NonePositionalDDP", "structure_faults:StorageDedupDDP", "structure_faults:BigParamDDP",
         "structure_faults:LazyParamsDDP", "structure_faults:NoneSlotDDP", "structure_faults:NestedBuffersDDP",
         "structure_faults:RootParamsChildrenOnlyDDP"]
# optional filters: DEMO_CASES=a,b DEMO_IMPLS=torch,x:Y DEMO_OUT=file.json
if os.environ.get("DEMO_CASES"):
    CASES = {k: CASES[k] for k in os.environ["DEMO_CASES"].split(",")}
if os.environ.get("DEMO_IMPLS"):
    IMPLS = os.environ["DEMO_IMPLS"].split(",")


def load(impl):
    if impl == "torch":
        return torch.nn.parallel.DistributedDataParallel
    mod, cls = impl.split(":")
    return getattr(importlib.import_module(f"tests.outside.{mod}"), cls)


def run_one(case, impl, rank):
    torch.manual_seed(100 + rank)             # replicas start different: construction sync matters
    model = CASES[case]()
    if case == "lazy_after_dry_run":
        with torch.no_grad():
            model(batches(case, rank, -1)[0][0])
    try:
        ddp = load(impl)(model)
    except Exception as e:                     # torch refuses lazy modules
        return {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        args, kwargs, y = batches(case, rank, step)
        opt.zero_grad()
        loss = F.mse_loss(ddp(*args, **kwargs), y)
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def worker(rank, case, port, outdir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=W)
    res = {impl: run_one(case, impl, rank) for impl in IMPLS}
    torch.save(res, os.path.join(outdir, f"{case}_{rank}.pt"))
    dist.destroy_process_group()


def maxdiff(a, b):
    if "error" in a or "error" in b:
        return None
    return max((a[k].double() - b[k].double()).abs().max().item() if a[k].numel() else 0.0
               for k in a)


def main():
    out = {}
    outdir = tempfile.mkdtemp()
    for i, case in enumerate(CASES):
        mp.spawn(worker, args=(case, 29700 + i, outdir), nprocs=W, join=True)
        r = [torch.load(os.path.join(outdir, f"{case}_{k}.pt")) for k in range(W)]
        out[case] = {}
        for impl in IMPLS:
            a0, a1 = r[0][impl], r[1][impl]
            entry = {}
            if "error" in a0:
                entry["error"] = a0["error"]
            else:
                entry["replica_disagreement"] = maxdiff(a0, a1)
                entry["vs_torch_max_abs"] = (None if "error" in r[0]["torch"] else
                                             max(maxdiff(a0, r[0]["torch"]), maxdiff(a1, r[1]["torch"])))
                if entry["vs_torch_max_abs"] is not None:
                    bad = sorted(k for k in a0 if not (torch.equal(a0[k], r[0]["torch"][k]) and
                                                       torch.equal(a1[k], r[1]["torch"][k])))
                    entry["differs_from_torch"] = bad
            out[case][impl] = entry
        print(case, json.dumps(out[case]), flush=True)
    json.dump(out, open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                     os.environ.get("DEMO_OUT", "demo_results.json")), "w"), indent=1)


if __name__ == "__main__":
    main()
