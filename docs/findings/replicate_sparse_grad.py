"""Finding: torch.distributed._composable.replicate() cannot train a module with
a sparse gradient (Embedding(sparse=True)): backward raises
"NotImplementedError: Cannot access storage of SparseTensorImpl" on every rank
(torch 2.13 CPU, gloo). DDP learns which parameters get sparse gradients from
the modules holding them (Embedding/EmbeddingBag with sparse=True) and gives
those their own sparse bucket; replicate() builds its inner DDP over a
ParameterList of the module's parameters, so that DDP expects a dense gradient,
puts the embedding weight in a dense bucket and fails copying the sparse
gradient into it. Checked here: DDP over the module averages the sparse
gradient (equal to the mean of the replicas' local gradients), and DDP over a
module holding the same weight as a plain parameter (F.embedding(sparse=True):
no Embedding module for DDP to see, as in replicate()) raises the same error.

Run: python replicate_sparse_grad.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (DDP averages the sparse gradient, replicate() raises the
sparse-storage error on every rank); 3: replicate() averages it (no longer
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
TIMEOUT_S = 600  # spawn + import under load is slow; a hang is bounded
ATOL = 1e-6  # float32 mean of two O(1) values; a replica's own gradient is O(1) off it
SPARSE_STORAGE = "NotImplementedError: Cannot access storage of SparseTensorImpl"


class HiddenEmbedding(torch.nn.Module):
    """emb's weight as a plain parameter, looked up with F.embedding(sparse=True):
    DDP sees no Embedding module, as the DDP inside replicate() does."""

    def __init__(self, emb):
        super().__init__()
        self.weight = emb.weight

    def forward(self, ids):
        return torch.nn.functional.embedding(ids, self.weight, sparse=True)


def make():
    torch.manual_seed(0)
    return torch.nn.Embedding(8, 4, sparse=True)


def mean_local_grad(ids):
    """The replicas' local (dense) gradients averaged: what DDP must produce."""
    emb = make()
    emb(ids).sum().backward()
    g = emb.weight.grad.to_dense()
    gathered = [torch.zeros_like(g) for _ in range(WORLD_SIZE)]
    dist.all_gather(gathered, g)
    return sum(gathered) / WORLD_SIZE


def step(mode, ids, want):
    from torch.distributed._composable.replicate import replicate
    emb = make()
    try:
        if mode == "DDP":
            ddp = torch.nn.parallel.DistributedDataParallel(emb)  # held: its reducer dies with it
            ddp(ids).sum().backward()
        elif mode == "replicate":
            replicate(emb)(ids).sum().backward()
        else:  # the same weight, the Embedding module hidden from DDP as in replicate()
            ddp = torch.nn.parallel.DistributedDataParallel(HiddenEmbedding(emb))
            ddp(ids).sum().backward()
    except Exception as exc:  # the finding: report, do not re-raise
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    g = emb.weight.grad
    if not g.is_sparse:
        return "gradient no longer sparse"
    dev = float((g.to_dense() - want).abs().max())
    return "ok" if dev <= ATOL else f"gradient off the replica mean by {dev:.3g}"


MODES = ("DDP", "replicate", "DDP, Embedding module hidden")


def replica(rank, path, out):
    try:
        dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                                world_size=WORLD_SIZE)
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
    ddp, rep, hidden = zip(*res)
    if all(m == "ok" for m in ddp):
        if all(m == SPARSE_STORAGE for m in rep):
            same = all(m == SPARSE_STORAGE for m in hidden)
            print("REPRODUCED: replicate() put the sparse gradient in a dense bucket"
                  + (" (as DDP does when it sees no Embedding module)" if same else ""))
            return 0
        if all(m == "ok" for m in rep):
            print("NO LONGER REPRODUCES: replicate() averaged the sparse gradient")
            return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
