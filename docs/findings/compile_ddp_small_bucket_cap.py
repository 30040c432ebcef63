"""Finding: torch.compile(DistributedDataParallel(m, bucket_cap_mb=c)) crashes
every rank with an AssertionError from dynamo's DDPOptimizer ("First bucket
should be smaller/equal to other buckets ...") whenever c < 1 MiB, a bucket cap
eager DDP accepts (torch 2.13 CPU, gloo).

Eager DDP sizes its first bucket with the user's bucket_cap_mb when one is
given (1 MiB only for the default); DDPOptimizer always takes
torch.distributed._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) as its first-bucket cap
and asserts it is <= the DDP module's bucket_bytes_cap, before tracing anything.

Run: python compile_ddp_small_bucket_cap.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (eager DDP steps with bucket_cap_mb=0.25, the compiled DDP
raises the assertion on every rank); 3: the compiled DDP steps too (no longer
reproduces); 4: anything else.
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
BUCKET_CAP_MB = 0.25


def one_step(compiled):
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2),
                                                    bucket_cap_mb=BUCKET_CAP_MB)
    model = torch.compile(ddp) if compiled else ddp
    try:
        model(torch.randn(3, 4)).sum().backward()
        return "ok"
    except Exception as exc:  # the finding: report, do not re-raise
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def replica(rank, path, out):
    try:
        dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                                world_size=WORLD_SIZE)
        torch.set_num_threads(1)
        msgs = [one_step(compiled=False), one_step(compiled=True)]
        dist.destroy_process_group()
    except Exception as exc:
        msgs = [f"setup error {type(exc).__name__}: {exc}"] * 2
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(m.replace("\n", " ") for m in msgs))
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
    res = [open(os.path.join(d, f"out.{r}")).read().split("\n") for r in range(WORLD_SIZE)]
    for r, (eager, compiled) in enumerate(res):
        print(f"rank {r}: bucket_cap_mb={BUCKET_CAP_MB}: eager DDP: {eager}")
        print(f"rank {r}: bucket_cap_mb={BUCKET_CAP_MB}: torch.compile(DDP): {compiled}")
    print(f"torch {torch.__version__}, DDPOptimizer first-bucket cap "
          f"(_DEFAULT_FIRST_BUCKET_BYTES) {dist._DEFAULT_FIRST_BUCKET_BYTES} B, "
          f"bucket_cap_mb={BUCKET_CAP_MB} -> {int(BUCKET_CAP_MB * 1024 * 1024)} B")
    if all(e == "ok" for e, _ in res):
        if all(c.startswith("AssertionError") and "First bucket" in c for _, c in res):
            print("REPRODUCED: the compiled DDP rejects a bucket cap eager DDP accepts")
            return 0
        if all(c == "ok" for _, c in res):
            print("NO LONGER REPRODUCES: the compiled DDP steps with the small bucket cap")
            return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
