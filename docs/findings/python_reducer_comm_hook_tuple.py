"""Finding: under compiled DDP (optimize_ddp="python_reducer" + compiled
autograd), a communication hook registered with DDP.register_comm_hook is
called with a (param.grad, param) tuple instead of the dist.GradBucket that
register_comm_hook documents; torch's own reference hook,
default_hooks.allreduce_hook, then fails on every rank with
"AttributeError: 'tuple' object has no attribute 'buffer'" (torch 2.13 CPU,
gloo). The same hook works on eager DDP (checked here first).

Run: python python_reducer_comm_hook_tuple.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (eager DDP steps with the hook, the compiled step raises
the AttributeError on every rank); 3: the compiled step runs with the hook (no
longer reproduces); 4: anything else.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

WORLD_SIZE = 2
TIMEOUT_S = 900  # torch.compile on a loaded 2-core machine is slow
COMPILED_DDP = {"optimize_ddp": "python_reducer", "compiled_autograd": True}


def run(compiled):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    try:
        if not compiled:
            ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
            ddp(x).sum().backward()
            return "ok"
        # DDP reads the mode at construction; the step is compiled under the
        # flags too (compiled autograd is not honoured otherwise).
        with torch._dynamo.config.patch(**COMPILED_DDP):
            ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)

            @torch.compile
            def step(x):
                loss = ddp(x).sum()
                loss.backward()
                return loss

            step(x)
        return "ok"
    except Exception as exc:  # the finding: report, do not re-raise
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def replica(rank, path, out):
    try:
        dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                                world_size=WORLD_SIZE)
        torch.set_num_threads(1)
        msgs = [run(compiled=False), run(compiled=True)]
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
        print(f"rank {r}: allreduce_hook, eager DDP: {eager}")
        print(f"rank {r}: allreduce_hook, compiled DDP (python_reducer + compiled autograd): "
              f"{compiled}")
    print(f"torch {torch.__version__}")
    if all(e == "ok" for e, _ in res):
        if all(c.startswith("AttributeError") and "'tuple'" in c and "buffer" in c
               for _, c in res):
            print("REPRODUCED: the python reducer passed the comm hook a tuple, not a GradBucket")
            return 0
        if all(c == "ok" for _, c in res):
            print("NO LONGER REPRODUCES: the compiled step ran with the comm hook")
            return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
