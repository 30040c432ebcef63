"""Finding: DistributedDataParallel built under
torch._dynamo.config.optimize_ddp = "python_reducer" (the compiled DDP mode)
cannot reduce a sparse gradient (Embedding(sparse=True)): its per-parameter
post-accumulate-grad hook passes the gradient to the functional all-reduce
(torch.distributed._functional_collectives.all_reduce), which has no sparse
path and raises "unsupported memory format option Contiguous" on every rank -
in the compiled step (compiled autograd, the kit's path) and in an eager
backward alike (torch 2.13 CPU, gloo). Eager DDP with its C++ reducer gives a
sparse parameter its own bucket and all-reduces the sparse gradient (checked
here first: the gradient equals the mean of the replicas' local gradients).

Run: python python_reducer_sparse_grad.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (eager DDP averages the sparse gradient; python_reducer DDP,
eager backward and compiled step, raises the memory-format error on every
rank); 3: both python_reducer steps run and match eager DDP (no longer
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
TIMEOUT_S = 900  # torch.compile on a loaded 2-core machine is slow
COMPILED_DDP = {"optimize_ddp": "python_reducer", "compiled_autograd": True}
MODES = ("eager DDP", "python_reducer DDP, eager backward",
         "compiled DDP (python_reducer + compiled autograd)")
ATOL = 1e-6  # float32 mean of two O(1) values; a replica's own gradient is O(1) off it


class Bag(torch.nn.Module):
    """y = sum(E[ids]): E an Embedding(8, 4, sparse=True), ids int64 (2, 2)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4, sparse=True)

    def forward(self, ids):
        return self.emb(ids).sum()


def mean_local_grad(ids):
    """The replicas' local (dense) gradients averaged: what DDP must produce."""
    torch.manual_seed(0)
    m = Bag()
    m(ids).backward()
    g = m.emb.weight.grad.to_dense()
    gathered = [torch.zeros_like(g) for _ in range(WORLD_SIZE)]
    dist.all_gather(gathered, g)
    return sum(gathered) / WORLD_SIZE


def step(mode, ids, want):
    torch.manual_seed(0)
    m = Bag()
    try:
        if mode == MODES[0]:
            ddp = torch.nn.parallel.DistributedDataParallel(m)  # held: its reducer dies with it
            ddp(ids).backward()
        elif mode == MODES[1]:
            with torch._dynamo.config.patch(optimize_ddp="python_reducer"):
                ddp = torch.nn.parallel.DistributedDataParallel(m)
            ddp(ids).backward()
        else:
            # DDP reads the mode at construction; the step is compiled under the
            # flags too (compiled autograd is not honoured otherwise).
            with torch._dynamo.config.patch(**COMPILED_DDP):
                ddp = torch.nn.parallel.DistributedDataParallel(m)

                @torch.compile
                def fwd_bwd(ids):
                    loss = ddp(ids)
                    loss.backward()
                    return loss

                fwd_bwd(ids)
    except Exception as exc:  # the finding: report, do not re-raise
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    g = m.emb.weight.grad
    if not g.is_sparse:
        return "gradient no longer sparse"
    dev = float((g.to_dense() - want).abs().max())
    return "ok" if dev <= ATOL else f"gradient off the replica mean by {dev:.3g}"


def replica(rank, path, out):
    try:
        dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                                world_size=WORLD_SIZE)
        torch.set_num_threads(1)
        ids = torch.tensor([[1, 2], [3, 4 + rank]])  # row 4 or 5: replicas differ
        want = mean_local_grad(ids)
        msgs = [step(mode, ids, want) for mode in MODES]
        dist.destroy_process_group()
    except Exception as exc:
        msgs = [f"setup error {type(exc).__name__}: {exc}"] * len(MODES)
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
    for r, msgs in enumerate(res):
        for mode, msg in zip(MODES, msgs):
            print(f"rank {r}: Embedding(sparse=True), {mode}: {msg}")
    print(f"torch {torch.__version__}")
    if all(msgs[0] == "ok" for msgs in res):
        if all(m == "RuntimeError: unsupported memory format option Contiguous"
               for msgs in res for m in msgs[1:]):
            print("REPRODUCED: python_reducer DDP cannot all-reduce a sparse gradient")
            return 0
        if all(m == "ok" for msgs in res for m in msgs[1:]):
            print("NO LONGER REPRODUCES: python_reducer DDP averaged the sparse gradient")
            return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
