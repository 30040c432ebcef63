"""Finding: DistributedDataParallel(static_graph=True) fails at the first backward under
no_sync() (gradient accumulation): "expect_autograd_hooks_ INTERNAL ASSERT FAILED" in
reducer.cpp (torch 2.13 CPU, gloo). Reported upstream: pytorch/pytorch#143580; fix in review:
pytorch/pytorch#187732 (which also says that, once the assertion is passed, gradients stop
being all-reduced from the second iteration).

Run: python static_graph_no_sync.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (the no_sync backward raises while the same loop without static_graph and
static_graph without no_sync both step); 3: static_graph accumulates under no_sync now;
4: anything else.
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


def accumulate(static_graph, micro_steps, rank):
    """One optimizer step of `micro_steps` micro-batches (all but the last under no_sync);
    '' on success, else the error's first line."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), static_graph=static_graph)
    try:
        for j in range(micro_steps):
            x = torch.randn(3, 4) + rank
            if j < micro_steps - 1:
                with model.no_sync():
                    model(x).sum().backward()
            else:
                model(x).sum().backward()
        return ""
    except RuntimeError as exc:
        return str(exc).splitlines()[0][:120]


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    results = [accumulate(False, 2, rank), accumulate(True, 1, rank), accumulate(True, 2, rank)]
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(results))
    os._exit(0)  # a failed static-graph reducer may hold the group: do not wait on teardown


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
    plain, static_one, static_accum = open(os.path.join(d, "out.0")).read().split("\n")
    print(f"no static_graph, 2 micro-steps: {plain or 'ok'}")
    print(f"static_graph, 1 micro-step: {static_one or 'ok'}")
    print(f"static_graph, 2 micro-steps (first under no_sync): {static_accum or 'ok'}")
    print(f"torch {torch.__version__}")
    if not plain and not static_one and "expect_autograd_hooks_" in static_accum:
        print("REPRODUCED: static_graph=True fails under no_sync()")
        return 0
    if not plain and not static_one and not static_accum:
        print("NO LONGER REPRODUCES: static_graph=True accumulates under no_sync()")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
