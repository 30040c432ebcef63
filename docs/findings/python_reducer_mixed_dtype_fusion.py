"""Finding: compiled DDP (optimize_ddp="python_reducer" + compiled autograd)
fails on a model whose parameters have two dtypes. DDP turns on inductor's
DDP all-reduce fusion in that mode (torch._inductor.config._fuse_ddp_communication),
whose default pass concatenates the per-parameter gradients of a bucket into one
tensor without grouping them by dtype: the concatenation promotes, the split
hands a gradient back in the other parameter's dtype, and the copy into .grad
raises "attempting to assign a gradient with dtype ... to a tensor with
grad_dtype ..." on every rank (torch 2.13 CPU, gloo). Eager DDP buckets by
dtype and steps (checked here first, gradients compared with the mean of the
replicas' local gradients).

Cases (--case, default all): bf16 (a float32 and a bfloat16 parameter),
complex64 (a float32 and a complex64 parameter).
--without-fusion turns the fusion off after DDP's construction (diagnosis: the
compiled step then runs and this script exits 3).

Run: python python_reducer_mixed_dtype_fusion.py [--case bf16|complex64|all]
     [--without-fusion]   (2 processes, gloo, FileStore)
Exit 0: reproduces (eager DDP averages the gradients, the compiled step raises
the grad_dtype error on every rank, every case); 3: the compiled step runs and
matches eager DDP (no longer reproduces); 4: anything else.
"""
import argparse
import json
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
DTYPES = {"bf16": torch.bfloat16, "complex64": torch.complex64}
# |grad - mean of local grads|: bfloat16 keeps 8 mantissa bits; gradients here are O(1),
# and a replica's own gradient is O(1) off the mean.
ATOL = {"bf16": 5e-2, "complex64": 1e-5}


class TwoDtypes(torch.nn.Module):
    """y = sum(x * a) + sum(Re(x * b)): a float32 (4,), b in the case's dtype (4,)."""

    def __init__(self, dtype):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(4))
        self.b = torch.nn.Parameter(torch.randn(4, dtype=dtype))

    def forward(self, x):
        z = x.to(self.b.dtype) * self.b
        z = z.real if z.is_complex() else z.float()
        return (x * self.a).sum() + z.sum()


def mean_local_grads(case, x):
    """The replicas' local gradients averaged (what DDP must produce), as complex128."""
    torch.manual_seed(0)
    m = TwoDtypes(DTYPES[case])
    m(x).backward()
    out = []
    for p in m.parameters():
        g = p.grad.to(torch.complex128)
        gathered = [torch.zeros_like(g) for _ in range(WORLD_SIZE)]
        dist.all_gather(gathered, g)
        out.append(sum(gathered) / WORLD_SIZE)
    return out


def step(case, compiled, without_fusion, x, want):
    torch.manual_seed(0)
    m = TwoDtypes(DTYPES[case])
    try:
        if not compiled:
            ddp = torch.nn.parallel.DistributedDataParallel(m)  # held: its reducer dies with it
            ddp(x).backward()
        else:
            # DDP reads the mode at construction; the step is compiled under the
            # flags too (compiled autograd is not honoured otherwise).
            with torch._dynamo.config.patch(**COMPILED_DDP):
                ddp = torch.nn.parallel.DistributedDataParallel(m)
                if without_fusion:  # DDP's constructor turned it on
                    torch._inductor.config._fuse_ddp_communication = False

                @torch.compile
                def fwd_bwd(x):
                    loss = ddp(x)
                    loss.backward()
                    return loss

                fwd_bwd(x)
    except Exception as exc:  # the finding: report, do not re-raise
        first = str(exc).split(". ")[0].splitlines()[0] if str(exc) else ""  # first sentence
        return f"{type(exc).__name__}: {first}"
    bad = [f"{p.dtype} param got {p.grad.dtype} grad" for p in m.parameters()
           if p.grad.dtype != p.dtype]
    if bad:
        return "wrong gradient dtype: " + ", ".join(bad)
    dev = max(float((p.grad.to(torch.complex128) - w).abs().max())
              for p, w in zip(m.parameters(), want))
    return "ok" if dev <= ATOL[case] else f"gradient off the replica mean by {dev:.3g}"


def replica(rank, path, out, cases, without_fusion):
    res = {}
    try:
        dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                                world_size=WORLD_SIZE)
        torch.set_num_threads(1)
        for case in cases:
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))  # per replica
            want = mean_local_grads(case, x)
            res[case] = [step(case, c, without_fusion, x, want) for c in (False, True)]
            torch._dynamo.reset()
        dist.destroy_process_group()
    except Exception as exc:
        res = {c: [f"setup error {type(exc).__name__}: {exc}"] * 2 for c in cases}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(res, f)
    # Exit without interpreter teardown: torch's C++ static destructors can abort there
    # ("terminate called without an active exception": 2 of 11 runs before this exit,
    # 0 of 20 after), after the result above is written; that abort is not the finding.
    os._exit(0)


def bad_input(msg):
    """argparse's error: one line, exit 4 (the script's "anything else")."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(4)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=(*DTYPES, "all"), default="all")
    ap.add_argument("--without-fusion", action="store_true")
    ap.error = bad_input
    args = ap.parse_args(argv)
    cases = list(DTYPES) if args.case == "all" else [args.case]
    d = tempfile.mkdtemp()
    ctx = mp.start_processes(replica, args=(os.path.join(d, "store"), os.path.join(d, "out"),
                                            cases, args.without_fusion),
                             nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):  # False: some still run
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            print(f"TIMEOUT after {TIMEOUT_S} s")
            return 4
    res = [json.load(open(os.path.join(d, f"out.{r}"))) for r in range(WORLD_SIZE)]
    for case in cases:
        for r in range(WORLD_SIZE):
            eager, compiled = res[r][case]
            print(f"rank {r}: {case}, eager DDP: {eager}")
            print(f"rank {r}: {case}, compiled DDP (python_reducer + compiled autograd"
                  f"{', fusion off' if args.without_fusion else ''}): {compiled}")
    print(f"torch {torch.__version__}")
    outcomes = [res[r][c] for r in range(WORLD_SIZE) for c in cases]
    if all(e == "ok" for e, _ in outcomes):
        if all(c.startswith("RuntimeError: attempting to assign a gradient with dtype")
               for _, c in outcomes):
            print("REPRODUCED: the compiled step's all-reduce fusion mixed the gradients' dtypes")
            return 0
        if all(c == "ok" for _, c in outcomes):
            print("NO LONGER REPRODUCES: the compiled step averaged both dtypes' gradients")
            return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
