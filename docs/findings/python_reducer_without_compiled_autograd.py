"""Finding: DDP under optimize_ddp="python_reducer", stepped by a torch.compile'd
forward+loss+backward function WITHOUT compiled autograd, crashes every rank
with an AssertionError from a fake-kernel size check (torch 2.13 CPU, gloo).

Run: python python_reducer_without_compiled_autograd.py   (2 processes, gloo, FileStore)
Exit 0: the crash reproduces (printed); 3: every rank stepped (no longer
reproduces); 4: anything else (timeout, other error).
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD_SIZE = 2
TIMEOUT_S = 900  # torch.compile on a loaded 2-core machine is slow


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    torch.set_num_threads(1)
    torch._dynamo.config.optimize_ddp = "python_reducer"   # compiled_autograd left False
    torch.manual_seed(0)
    # Two layers: with a single nn.Linear the step runs (and the crash is absent).
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    model = torch.nn.parallel.DistributedDataParallel(net)

    @torch.compile
    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    try:
        step(torch.randn(4, 16), torch.randn(4, 2))
        msg = "ok"
    except Exception as exc:  # the finding: report, do not re-raise
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    with open(f"{out}.{rank}", "w") as f:
        f.write(msg)
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
    msgs = [open(os.path.join(d, f"out.{r}")).read() for r in range(WORLD_SIZE)]
    for r, m in enumerate(msgs):
        print(f"rank {r}: {m}")
    print(f"torch {torch.__version__}")
    if all(m.startswith("AssertionError") and "expected size" in m for m in msgs):
        print("REPRODUCED: every rank crashed in the fake-kernel size assertion")
        return 0
    if all(m == "ok" for m in msgs):
        print("NO LONGER REPRODUCES: every rank stepped")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
