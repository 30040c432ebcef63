"""Finding: DistributedDataParallel built under
torch._dynamo.config.optimize_ddp = "python_reducer" (the compiled DDP mode)
never broadcasts buffers before a forward: broadcast_buffers=True (DDP's
default) is accepted and silently has no effect, because DDP's _pre_forward
returns early in that mode. Buffers are synced once, at construction
(torch 2.13 CPU, gloo). The kit saw it on the compiled step (compiled
autograd); the reproducer uses an eager forward, which takes the same path.

Run: python python_reducer_drops_broadcast_buffers.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (rank 0's buffer edit reaches rank 1 under the default mode,
not under python_reducer); 3: python_reducer broadcasts buffers now; 4: anything else.
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


def buffer_spread(mode, rank):
    """Max |running_mean(rank r) - running_mean(rank 0)| after rank 0 edits its
    buffer and every rank runs one training forward."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    net[1].momentum = 0.0             # forward leaves the running stats as they are
    with torch._dynamo.config.patch(optimize_ddp=mode):
        model = torch.nn.parallel.DistributedDataParallel(net, broadcast_buffers=True)
    with torch.no_grad():
        if rank == 0:
            net[1].running_mean.add_(1.0)   # DDP: reaches every replica at the next forward
    model(torch.randn(8, 4))
    gathered = [torch.zeros(4) for _ in range(WORLD_SIZE)]
    dist.all_gather(gathered, net[1].running_mean.detach().clone())
    return max(float((g - gathered[0]).abs().max()) for g in gathered)


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    default = buffer_spread("ddp_optimizer", rank)
    reducer = buffer_spread("python_reducer", rank)
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{default} {reducer}")
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
    ddp, red = (float(v) for v in open(os.path.join(d, "out.0")).read().split())
    print(f"running_mean spread across ranks after rank 0's edit and one forward: "
          f"optimize_ddp='ddp_optimizer' {ddp:g}, 'python_reducer' {red:g}")
    print(f"torch {torch.__version__}")
    if ddp == 0.0 and red >= 0.5:
        print("REPRODUCED: under python_reducer DDP did not broadcast rank 0's buffers")
        return 0
    if ddp == 0.0 and red == 0.0:
        print("NO LONGER REPRODUCES: python_reducer DDP broadcasts buffers")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
