"""Finding: gloo's all_reduce, broadcast, reduce and scatter give wrong results, without an error,
for an input that is a non-contiguous view (a stride-2 view of a longer buffer): they read and
write the view's storage as if it were dense (torch 2.13 CPU, 2 processes). all_gather, gather
and both reduce_scatter forms are right on the same inputs; all_to_all_single and send refuse
them. Reported upstream for scatter, broadcast and reduce: pytorch/pytorch#192920 (open) and,
for scatter, pytorch/pytorch#24836; all_reduce is not named there.

Run: python gloo_noncontiguous_collectives.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (each of the four ops is wrong on a strided input and right on the same
values made contiguous); 3: every op is right now; 4: anything else.
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
N = 6
TIMEOUT_S = 600  # spawn + import under load is slow; a hang is bounded


def strided(values):
    """``values`` (1-D) as a stride-2 view of a buffer twice as long, the gaps set to -1."""
    buf = torch.full((2 * values.numel(),), -1.0)
    view = buf[::2]
    view.copy_(values)
    return view


def ops(rank, contiguous):
    """{op: result on this rank as a list} with strided (or contiguous) inputs."""
    make = (lambda v: v.clone()) if contiguous else strided
    mine = torch.arange(N, dtype=torch.float32) + 10 * rank
    out = {}
    x = make(mine)
    dist.all_reduce(x)
    out["all_reduce"] = x.tolist()
    x = make(mine)
    dist.broadcast(x, src=0)
    out["broadcast"] = x.tolist()
    x = make(mine)
    dist.reduce(x, dst=0)
    out["reduce"] = x.tolist() if rank == 0 else None
    src = make(torch.arange(N * WORLD_SIZE, dtype=torch.float32))
    got = torch.empty(N)
    dist.scatter(got, list(src.chunk(WORLD_SIZE)) if rank == 0 else None, src=0)
    out["scatter"] = got.tolist()
    return out


def expected(rank):
    total = sum(torch.arange(N, dtype=torch.float32) + 10 * r for r in range(WORLD_SIZE))
    return {"all_reduce": total.tolist(), "broadcast": torch.arange(N, dtype=torch.float32).tolist(),
            "reduce": total.tolist() if rank == 0 else None,
            "scatter": (torch.arange(N, dtype=torch.float32) + N * rank).tolist()}


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    want = expected(rank)
    dense, strided_ = ops(rank, True), ops(rank, False)
    lines = [f"{op} dense_ok={dense[op] == want[op]} strided_ok={strided_[op] == want[op]} "
             f"strided={strided_[op]} expected={want[op]}" for op in want]
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(lines))
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
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            print("timed out")
            return 4
    lines = []
    for r in range(WORLD_SIZE):
        with open(os.path.join(d, f"out.{r}")) as f:
            lines += [f"rank {r}: {line}" for line in f.read().splitlines()]
    print("\n".join(lines))
    if any("dense_ok=False" in line for line in lines):
        return 4  # the contiguous control is wrong: something else broke
    wrong = {line.split()[2] for line in lines if "strided_ok=False" in line}
    print("wrong on a strided input:", sorted(wrong))
    if wrong == {"all_reduce", "broadcast", "reduce", "scatter"}:
        return 0
    return 3 if not wrong else 4


if __name__ == "__main__":
    sys.exit(main())
