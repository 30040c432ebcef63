"""Finding: fairscale 0.4.13's OSS + ShardedDataParallel re-lays a channels_last parameter as
contiguous at construction (its per-rank flat buffers make every parameter a contiguous view),
where torch's DistributedDataParallel keeps the parameter's strides: a model converted with
``.to(memory_format=torch.channels_last)`` silently trains in the other layout. torch 2.13 CPU, gloo.

Run: python engine_fairscale_channels_last.py   (2 processes, gloo, FileStore)
Exit 0: reproduces; 3: fairscale keeps the strides now; 4: anything else (fairscale missing).
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


def model():
    torch.manual_seed(0)
    return torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)


def replica(rank, path, out):
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim.oss import OSS
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    m = model()
    before = m.weight.stride()
    torch.nn.parallel.DistributedDataParallel(m)
    ddp = m.weight.stride()
    m = model()
    ShardedDataParallel(m, OSS(m.parameters(), optim=torch.optim.SGD, lr=0.1))
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{before} {ddp} {m.weight.stride()}".replace(" ", ""))
    dist.destroy_process_group()
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
    before, ddp, fs = open(os.path.join(d, "out.0")).read().replace(")(", ") (").split()
    print(f"weight strides: channels_last {before}, after torch DDP {ddp}, after fairscale {fs}")
    if before == ddp and fs != before:
        print("REPRODUCED: fairscale changed the parameter's layout")
        return 0
    return 3 if fs == before else 4


if __name__ == "__main__":
    sys.exit(main())
