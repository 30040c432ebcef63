"""Finding: fairscale 0.4.13's OSS (with ShardedDataParallel) refuses a model whose parameters
have more than one dtype, at construction: AssertionError "Different types for the bucket and
the param" (its flat per-rank buffers hold one dtype), where torch's DistributedDataParallel
trains the same model (a float32 and a bfloat16 parameter; complex64 alike). torch 2.13 CPU, gloo.

Run: python engine_fairscale_mixed_dtype.py   (2 processes, gloo, FileStore)
Exit 0: reproduces; 3: fairscale builds the model now; 4: anything else (fairscale missing).
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
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).to(torch.bfloat16))


def replica(rank, path, out):
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim.oss import OSS
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    torch.nn.parallel.DistributedDataParallel(model())  # torch's DDP builds it
    m = model()
    try:
        ShardedDataParallel(m, OSS(m.parameters(), optim=torch.optim.SGD, lr=0.1))
        got = "built"
    except AssertionError as exc:
        got = f"AssertionError: {exc}"
    with open(f"{out}.{rank}", "w") as f:
        f.write(got)
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
    got = open(os.path.join(d, "out.0")).read()
    print(f"torch DDP: built; fairscale ShardedDataParallel + OSS: {got}")
    if got.startswith("AssertionError"):
        print("REPRODUCED: fairscale refuses parameters of two dtypes")
        return 0
    return 3 if got == "built" else 4


if __name__ == "__main__":
    sys.exit(main())
