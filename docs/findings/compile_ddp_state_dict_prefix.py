"""Finding: the state_dict() of torch.compile(DistributedDataParallel(m)) has
its keys prefixed "_orig_mod.module." (the compile wrapper's attribute, then
DDP's), so the usual DDP checkpoint recipe -- save ddp.state_dict(), strip
"module.", load into a plain m -- fails with "Unexpected key(s)"; the same
recipe works on the uncompiled DDP (torch 2.13 CPU, gloo). No compilation
is needed: the keys come from the OptimizedModule wrapper's module tree.

Run: python compile_ddp_state_dict_prefix.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (the recipe loads from DDP, fails from the compiled DDP on
every rank); 3: the recipe works on the compiled DDP too (no longer
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


def ddp_recipe(compiled):
    """First key of the wrapper's state_dict, and the outcome of loading it,
    'module.' stripped, into a plain module."""
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    wrapper = torch.compile(ddp) if compiled else ddp
    sd = wrapper.state_dict()
    stripped = {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}
    try:
        torch.nn.Linear(4, 2).load_state_dict(stripped)
        outcome = "loaded"
    except Exception as exc:  # the finding: report, do not re-raise
        outcome = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return f"{next(iter(sd))} -> {outcome}"


def replica(rank, path, out):
    try:
        dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                                world_size=WORLD_SIZE)
        msgs = [ddp_recipe(compiled=False), ddp_recipe(compiled=True)]
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
    for r, (plain, compiled) in enumerate(res):
        print(f"rank {r}: DDP(m):               first key {plain}")
        print(f"rank {r}: torch.compile(DDP(m)): first key {compiled}")
    print(f"torch {torch.__version__}")
    if all(p.endswith("-> loaded") for p, _ in res):
        if all(c.startswith("_orig_mod.module.") and "Unexpected key" in c for _, c in res):
            print("REPRODUCED: the DDP checkpoint recipe fails on the compiled DDP's state_dict")
            return 0
        if all(c.endswith("-> loaded") for _, c in res):
            print("NO LONGER REPRODUCES: the compiled DDP's state_dict loads with the DDP recipe")
            return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
