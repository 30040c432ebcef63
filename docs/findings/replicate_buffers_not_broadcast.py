"""Finding: torch.distributed._composable.replicate() never broadcasts buffers.
Its inner DistributedDataParallel is built over a ParameterList of the module's
parameters, so BatchNorm running statistics are neither synced at the first
forward (DDP: rank 0's module state) nor before every forward
(DDP's default broadcast_buffers=True), and DDP keywords such as
broadcast_buffers=True are accepted and silently have no effect (torch 2.13 CPU, gloo).

Run: python replicate_buffers_not_broadcast.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (replicate leaves rank 1's running_mean differing from rank 0's
while torch DDP makes them equal); 3: replicate syncs buffers now; 4: anything else.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
TIMEOUT_S = 600  # spawn + import under load is slow; a hang is bounded


def buffer_spread(wrap, rank):
    """Max |running_mean(rank r) - running_mean(rank 0)| after one training forward."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    net[1].momentum = 0.0             # forward leaves the running stats as they are
    with torch.no_grad():
        net[1].running_mean.add_(float(rank))   # rank 1 starts from other buffers
    model = wrap(net)
    model(torch.randn(8, 4))
    gathered = [torch.zeros(4) for _ in range(WORLD_SIZE)]
    dist.all_gather(gathered, net[1].running_mean.detach().clone())
    return max(float((g - gathered[0]).abs().max()) for g in gathered)


def replica(rank, path, out):
    from torch.distributed._composable.replicate import replicate
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    ddp = buffer_spread(lambda m: torch.nn.parallel.DistributedDataParallel(m, broadcast_buffers=True), rank)
    rep = buffer_spread(lambda m: replicate(m, broadcast_buffers=True), rank)
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{ddp} {rep}")
    dist.destroy_process_group()
    # Exit without interpreter teardown: torch's C++ static destructors can abort there
    # ("terminate called without an active exception": 2 of 11 runs before this exit,
    # 0 of 20 after), after the result above is written; that abort is not the finding.
    os._exit(0)


def main():
    d = tempfile.mkdtemp()
    ctx = mp.start_processes(replica, args=(os.path.join(d, "store"), os.path.join(d, "out")),
                             nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):  # False: some still run
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            print(f"TIMEOUT after {TIMEOUT_S} s")
            return 4
    ddp, rep = (float(v) for v in open(os.path.join(d, "out.0")).read().split())
    print(f"running_mean spread across ranks after one forward: DDP {ddp:g}, replicate {rep:g}")
    print(f"torch {torch.__version__}")
    if ddp == 0.0 and rep >= 0.5:
        print("REPRODUCED: replicate() did not broadcast rank 0's buffers")
        return 0
    if ddp == 0.0 and rep == 0.0:
        print("NO LONGER REPRODUCES: replicate() broadcasts buffers")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
