"""Finding: torch.compile(DistributedDataParallel(m)) compiles no graph at all
when the root module ``m`` is a bare torch.nn class (nn.Sequential, nn.Linear):
the step silently runs eagerly. The same model behind a one-line user subclass
compiles (torch 2.13 CPU, gloo). Dynamo skips DDP.forward (torch file) and, as
a top-level frame below it, the torch.nn root's forward as well.

Run: python compile_ddp_torch_nn_root.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (0 graphs for the bare root, >= 1 for the subclass); 3: the
bare root compiles now (no longer reproduces); 4: anything else.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
TIMEOUT_S = 900


class UserSequential(torch.nn.Sequential):
    def forward(self, x):
        return super().forward(x)


def graphs_compiled(cls):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    net = cls(torch.nn.Linear(10, 10), torch.nn.Tanh(), torch.nn.Linear(10, 10))
    model = torch.compile(torch.nn.parallel.DistributedDataParallel(net))
    model(torch.randn(3, 10)).sum().backward()
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    torch.set_num_threads(1)
    res = (graphs_compiled(torch.nn.Sequential), graphs_compiled(UserSequential))
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{res[0]} {res[1]}")
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
    while True:
        try:
            if ctx.join(timeout=max(1.0, deadline - time.monotonic())):
                break
        except mp.ProcessExitedException as exc:
            # a rank that wrote its result and then aborted in teardown (seen once on a loaded
            # machine: "terminate called without an active exception") measured what it had to
            if not all(os.path.exists(os.path.join(d, f"out.{r}")) for r in range(WORLD_SIZE)):
                raise
            print(f"note: {exc} after writing its result")
            for p in ctx.processes:
                p.kill()
            break
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            print(f"TIMEOUT after {TIMEOUT_S} s")
            return 4
    res = [tuple(int(v) for v in open(os.path.join(d, f"out.{r}")).read().split())
           for r in range(WORLD_SIZE)]
    for r, (bare, user) in enumerate(res):
        print(f"rank {r}: graphs compiled: torch.nn.Sequential root {bare}, user subclass {user}")
    print(f"torch {torch.__version__}")
    if all(bare == 0 and user >= 1 for bare, user in res):
        print("REPRODUCED: torch.compile(DDP(nn.Sequential)) compiled nothing (ran eagerly)")
        return 0
    if all(bare >= 1 for bare, _ in res):
        print("NO LONGER REPRODUCES: the bare torch.nn root compiles")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
