"""Finding: accelerate 1.16.0's ``Accelerator(cpu=True).prepare(model, optimizer)`` replaces
every buffer of the model with a copy: on CPU it moves the model to ``torch.device("cpu", 0)``,
and ``Tensor.to("cpu:0")`` of a ``cpu`` tensor copies (parameters keep their identity, their
``.data`` is set; buffers are reassigned). A reference a user (or a hook) holds to a buffer,
e.g. a BatchNorm's ``running_mean``, no longer sees training; torch's DistributedDataParallel
keeps every buffer. torch 2.13 CPU, gloo.

Run: python engine_accelerate_buffers_copied.py   (2 processes, gloo, FileStore)
Exit 0: reproduces; 3: accelerate keeps the buffers now; 4: anything else (accelerate missing).
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


def same_buffers(wrap):
    """Whether every buffer of a BatchNorm model is the same tensor after ``wrap``."""
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    before = [id(b) for b in m.buffers()]
    wrap(m)
    return all(id(b) == i for b, i in zip(m.buffers(), before))


def replica(rank, path, out):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    from accelerate import Accelerator
    ddp = same_buffers(torch.nn.parallel.DistributedDataParallel)
    acc = Accelerator(cpu=True)
    prepared = same_buffers(lambda m: acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1)))
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{ddp} {prepared} {acc.num_processes}")
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
    ddp, prepared, n = open(os.path.join(d, "out.0")).read().split()
    print(f"buffers kept: torch DDP {ddp}, accelerate prepare {prepared} ({n} processes)")
    if ddp == "True" and prepared == "False" and n == str(WORLD_SIZE):
        print("REPRODUCED: accelerate replaced the model's buffers with copies")
        return 0
    return 3 if prepared == "True" else 4


if __name__ == "__main__":
    sys.exit(main())
