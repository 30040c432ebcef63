"""Finding: DeepSpeed 0.19.8's engine (``deepspeed.initialize``, ZeRO 0-2) broadcasts rank 0's
parameters at construction but no buffer, and never syncs buffers before a forward: BatchNorm
running statistics differ across ranks from the start, where torch's DistributedDataParallel
(``broadcast_buffers=True``, its default) gives every rank rank 0's buffers at construction and
before every forward. torch 2.13 CPU, gloo (DeepSpeed's CPU accelerator without oneCCL).

Run: python engine_deepspeed_buffers_not_broadcast.py   (2 processes, gloo, FileStore)
Exit 0: reproduces; 3: DeepSpeed syncs buffers now; 4: anything else (deepspeed missing).
The first run builds DeepSpeed's deepspeed_shm_comm extension (about 40 s on a quiet machine).
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
TIMEOUT_S = 1800  # the extension build under load
CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
          "zero_optimization": {"stage": 0}}


def buffer_spread(wrap, rank):
    """Max |running_mean(rank r) - running_mean(rank 0)| after construction."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        net[1].running_mean.add_(float(rank))   # rank 1 starts from other buffers
    wrap(net)
    gathered = [torch.zeros(4) for _ in range(WORLD_SIZE)]
    dist.all_gather(gathered, net[1].running_mean.detach().clone())
    return max(float((g - gathered[0]).abs().max()) for g in gathered)


def replica(rank, path, out):
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    import deepspeed
    ddp = buffer_spread(torch.nn.parallel.DistributedDataParallel, rank)
    ds = buffer_spread(lambda m: deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                                                      config=CONFIG), rank)
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{ddp} {ds}")
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
    ddp, ds = (float(v) for v in open(os.path.join(d, "out.0")).read().split())
    print(f"running_mean spread across ranks after construction: torch DDP {ddp:g}, DeepSpeed {ds:g}")
    if ddp == 0.0 and ds >= 1.0:
        print("REPRODUCED: DeepSpeed did not broadcast rank 0's buffers")
        return 0
    return 3 if ds == 0.0 else 4


if __name__ == "__main__":
    sys.exit(main())
