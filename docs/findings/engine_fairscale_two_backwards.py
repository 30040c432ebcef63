"""Finding: fairscale 0.4.13's ShardedDataParallel gets the gradient wrong when one optimizer
step has two synchronised backwards (no ``no_sync()``): torch's DistributedDataParallel gives
the sum of the two averaged gradients, as one device would; ShardedDataParallel's owner rank
holds another value, silently. torch 2.13 CPU, gloo, 2 processes.

Run: python engine_fairscale_two_backwards.py
Exit 0: reproduces; 3: fairscale's gradient is right now; 4: anything else (fairscale missing).
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
TIMEOUT_S = 600
BOUND = 1e-5
BACKWARDS = 2


def net():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def batches(rank):
    torch.manual_seed(10 + rank)
    return [torch.randn(2, 3) for _ in range(BACKWARDS)]


def reference():
    """One device: per backward, the mean over ranks of each rank's summed loss."""
    m = net()
    for b in range(BACKWARDS):
        sum(m(batches(r)[b]).sum() for r in range(WORLD_SIZE)).div(WORLD_SIZE).backward()
    return m.weight.grad


def replica(rank, path, out):
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim.oss import OSS
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    m = net()
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    for x in batches(rank):
        ddp(x).sum().backward()
    torch_grad = m.weight.grad.clone()
    m = net()
    oss = OSS(m.parameters(), optim=torch.optim.SGD, lr=0.1)
    sdp = ShardedDataParallel(m, oss)
    for x in batches(rank):
        sdp(x).sum().backward()
    owner = oss._param_to_rank[m.weight]  # the rank holding the reduced gradient
    g = m.weight.grad.clone() if rank == owner else torch.zeros_like(torch_grad)
    dist.broadcast(g, src=owner)
    ref = reference()
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{(torch_grad - ref).abs().max().item()} {(g - ref).abs().max().item()}")
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
    print(f"weight gradient after {BACKWARDS} synchronised backwards, off the single-device one: "
          f"torch DDP {torch_dev:.3g}, fairscale {fs_dev:.3g} (bound {BOUND})")
    if torch_dev <= BOUND < fs_dev:
        print("REPRODUCED: fairscale's gradient over two synchronised backwards is wrong")
        return 0
    return 3 if fs_dev <= BOUND else 4


if __name__ == "__main__":
    sys.exit(main())
