"""Finding: DistributedDataParallel(find_unused_parameters=True) fails after a forward with grad
enabled that no backward follows (a validation forward written without torch.no_grad()) when
the next backward runs under no_sync() and leaves a parameter unused: the forward after it
raises "Expected to have finished reduction in the prior iteration before starting a new one"
(torch 2.13 CPU, gloo). Either alone steps: the grad-enabled forward followed by a synced
backward, or the no_sync() window without the grad-enabled forward.

Run: python forward_without_backward_then_no_sync.py   (2 processes, gloo, FileStore)
Exit 0: reproduces; 3: the loop steps now; 4: anything else.
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


class TwoBranch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x, use_a=True):
        return (self.a(x) if use_a else 0) + self.b(x)


def loop(validate, accumulate, rank):
    """Two optimizer steps (no optimizer: the reducer is what fails): maybe a grad-enabled forward
    whose output is dropped, maybe a no_sync() micro-step using branch b only, then a synced
    micro-step using both; '' on success, else the error's first line."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(TwoBranch(), find_unused_parameters=True)
    x = torch.randn(3, 4) + rank
    try:
        for _ in range(2):
            if validate:
                model(x)  # grad enabled, no backward
            if accumulate:
                with model.no_sync():
                    model(x, use_a=False).sum().backward()
            model(x).sum().backward()
        return ""
    except RuntimeError as exc:
        return str(exc).splitlines()[0][:120]


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    results = [loop(True, False, rank), loop(False, True, rank), loop(True, True, rank)]
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(results))
    os._exit(0)  # a failed reducer may hold the group: do not wait on teardown


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
    validate, accumulate, both = open(os.path.join(d, "out.0")).read().split("\n")
    print(f"grad-enabled forward, then synced steps: {validate or 'ok'}")
    print(f"no_sync() window without it: {accumulate or 'ok'}")
    print(f"grad-enabled forward, then the no_sync() window: {both or 'ok'}")
    print(f"torch {torch.__version__}")
    if not validate and not accumulate and "Expected to have finished reduction" in both:
        print("REPRODUCED: a forward without backward, then no_sync(), breaks the reducer")
        return 0
    if not validate and not accumulate and not both:
        print("NO LONGER REPRODUCES: the loop steps")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
