"""Finding: fairscale 0.4.13's ShardedDataParallel reduces a parameter's gradient once per
backward: a layer used outside and again inside a reentrant checkpoint gets its gradient in two
accumulations, the wrapper reduces at the first and marks the parameter done, so the second
contribution stays local and the owner rank's gradient is wrong, silently. torch's
DistributedDataParallel with ``static_graph=True`` reduces the full gradient (without it, it has
the same defect: docs/findings.md, finding 12). torch 2.13 CPU, gloo, 2 processes.

Run: python engine_fairscale_reentrant_reuse.py
Exit 0: reproduces; 3: fairscale's gradient is right now; 4: anything else (fairscale missing).
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
TIMEOUT_S = 600
BOUND = 1e-5


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.block(x)  # used outside ...
        return checkpoint(self.block, torch.tanh(h), use_reentrant=True)  # ... and inside


def batch(rank):
    torch.manual_seed(1)
    x = torch.randn(2 * WORLD_SIZE, 4)
    return x if rank is None else x[2 * rank:2 * rank + 2]


def replica(rank, path, out):
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim.oss import OSS
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    m = Net()
    ddp = torch.nn.parallel.DistributedDataParallel(m, static_graph=True)
    ddp(batch(rank)).pow(2).mean().backward()
    torch_grad = m.block.weight.grad.clone()
    m = Net()
    oss = OSS(m.parameters(), optim=torch.optim.SGD, lr=0.1)
    sdp = ShardedDataParallel(m, oss)
    sdp(batch(rank)).pow(2).mean().backward()
    owner = oss._param_to_rank[m.block.weight]  # the rank holding the reduced gradient
    g = m.block.weight.grad.clone() if rank == owner else torch.zeros_like(torch_grad)
    dist.broadcast(g, src=owner)
    ref = Net()
    ref(batch(None)).pow(2).mean().backward()
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{(torch_grad - ref.block.weight.grad).abs().max().item()} "
                f"{(g - ref.block.weight.grad).abs().max().item()}")
    dist.destroy_process_group()
    os._exit(0)


def main():
    d = tempfile.mkdtemp()
    ctx = mp.start_processes(replica, args=(os.path.join(d, "store"), os.path.join(d, "out")),
                             nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print(f"TIMEOUT after {TIMEOUT_S} s")
                return 4
    except Exception as exc:  # a replica raised (fairscale missing)
        print(f"replica failed: {exc}")
        return 4
    torch_dev, fs_dev = (float(v) for v in open(os.path.join(d, "out.0")).read().split())
    print(f"block.weight gradient off the single-device one: torch DDP(static_graph) {torch_dev:.3g}, "
          f"fairscale {fs_dev:.3g} (bound {BOUND})")
    if torch_dev <= BOUND < fs_dev:
        print("REPRODUCED: fairscale reduced only the first of the gradient's two contributions")
        return 0
    return 3 if fs_dev <= BOUND else 4


if __name__ == "__main__":
    sys.exit(main())
