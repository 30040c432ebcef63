"""Finding: DistributedDataParallel (static_graph=False, the default) gives silently wrong
gradients for a parameter used both before and inside one reentrant activation checkpoint
(torch.utils.checkpoint(..., use_reentrant=True)): no error, no warning, the same wrong
gradient on every rank (torch 2.13 CPU, gloo). With static_graph=True the gradients match a
single device trained on the global batch. torch's DDP note on checkpointing supports reentrant
checkpoints only for layers "checkpointed at most once" without unused parameters
(pytorch/pytorch#68827, #106985); older releases raised "Expected to mark a variable ready only
once" for reused parameters (pytorch/pytorch#24005); a silent gradient-sync failure with
gradient checkpointing is reported in pytorch/pytorch#121594.

Run: python reentrant_checkpoint_outside_use.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (static_graph=False off by more than 1e-3 on both ranks, static_graph=True
within 1e-5); 3: static_graph=False matches now; 4: anything else.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.checkpoint import checkpoint

WORLD_SIZE = 2
TIMEOUT_S = 600  # spawn + import under load is slow; a hang is bounded
WRONG, RIGHT = 1e-3, 1e-5  # a float32 Linear(4, 4) step agrees to ~1e-7 when right


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)  # the weight is used here ...
        return checkpoint(self.lin, torch.tanh(h), use_reentrant=True)  # ... and again in here


def gradients(model, x, y):
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def max_dev(static_graph, rank):
    """max |grad - single-device grad| over weight and bias for one step on this rank's half."""
    torch.manual_seed(0)
    single = Block()
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Block(), static_graph=static_graph)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, generator=g, requires_grad=True)
    y = torch.randn(8, 4, generator=g)
    want = gradients(single, x, y)
    half = slice(rank * 4, rank * 4 + 4)
    got = gradients(ddp, x[half], y[half])
    return max(float((a - b).abs().max()) for a, b in zip(want, got))


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    devs = [max_dev(False, rank), max_dev(True, rank)]
    with open(f"{out}.{rank}", "w") as f:
        f.write(" ".join(map(repr, devs)))
    os._exit(0)


def main():
    d = tempfile.mkdtemp()
    ctx = mp.start_processes(replica, args=(os.path.join(d, "store"), os.path.join(d, "out")),
                             nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            print(f"TIMEOUT after {TIMEOUT_S} s")
            return 4
    devs = [tuple(map(float, open(os.path.join(d, f"out.{r}")).read().split())) for r in range(WORLD_SIZE)]
    for r, (dyn, static) in enumerate(devs):
        print(f"rank {r}: max |grad dev| static_graph=False {dyn:.3g}, static_graph=True {static:.3g}")
    print(f"torch {torch.__version__}")
    if all(static < RIGHT for _, static in devs):
        if all(dyn > WRONG for dyn, _ in devs):
            print("REPRODUCED: static_graph=False gives wrong gradients, silently")
            return 0
        if all(dyn < RIGHT for dyn, _ in devs):
            print("NO LONGER REPRODUCES: static_graph=False matches the single device")
            return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
