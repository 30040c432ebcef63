"""Finding: DeepSpeed 0.19.8's ZeRO stages 1 and 2 train a float64 model in float32: the
optimizer's partitions of the parameters are float32 copies, so one SGD step of a float64
nn.Linear lands a float32 rounding (about 1e-8) away from the float64 step torch's
DistributedDataParallel takes (exact to float64 rounding, about 1e-17), with no error or warning.
torch 2.13 CPU, gloo (DeepSpeed's CPU accelerator without oneCCL).

Run: python engine_deepspeed_float64_in_float32.py   (2 processes, gloo, FileStore)
Exit 0: reproduces; 3: ZeRO-1 steps float64 parameters in float64 now; 4: anything else
(deepspeed missing). The first run builds DeepSpeed's deepspeed_shm_comm extension (about 40 s on
a quiet machine).
"""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
TIMEOUT_S = 1800  # the extension build under load
LR = 0.1


def step_error(wrap, rank):
    """Max |parameter after one step - the float64 step on the global batch|, over both tensors."""
    torch.manual_seed(0)
    net = torch.nn.Linear(10, 4).double()
    start = [p.detach().clone() for p in net.parameters()]
    x = torch.randn(4, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    model, opt = wrap(net)
    opt_step = opt if opt is not None else model
    out = model(x)
    loss = out.pow(2).mean()
    if opt is None:  # DeepSpeed's engine owns backward and step
        model.backward(loss)
        model.step()
    else:
        loss.backward()
        opt_step.step()
    # the float64 reference: the mean of the replicas' gradients, one SGD step
    ref = torch.nn.Linear(10, 4).double()
    with torch.no_grad():
        for p, s in zip(ref.parameters(), start):
            p.copy_(s)
    ref(x).pow(2).mean().backward()
    errs = []
    for p, r, s in zip(net.parameters(), ref.parameters(), start):
        g = r.grad.clone()
        dist.all_reduce(g)
        errs.append(float((p.detach() - (s - LR * g / WORLD_SIZE)).abs().max()))
    return max(errs)


def replica(rank, path, out):
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    import deepspeed

    def ddp(m):
        return torch.nn.parallel.DistributedDataParallel(m), torch.optim.SGD(m.parameters(), lr=LR)

    def zero1(m):
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                  "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True}
        engine, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=LR), config=config)
        return engine, None

    results = [step_error(ddp, rank), step_error(zero1, rank)]
    with open(f"{out}.{rank}", "w") as f:
        f.write(" ".join(map(repr, results)))
    dist.destroy_process_group()
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
            print(f"TIMEOUT after {TIMEOUT_S} s")
            return 4
    ddp, zero1 = (float(v) for v in open(os.path.join(d, "out.0")).read().split())
    print(f"float64 Linear, one SGD step, max |param - float64 step|: torch DDP {ddp:.3g}, "
          f"DeepSpeed ZeRO-1 {zero1:.3g}")
    float64_exact, float32_rounding = 1e-14, 1e-9
    if ddp < float64_exact and zero1 > float32_rounding:
        print("REPRODUCED: ZeRO-1 stepped the float64 parameters in float32")
        return 0
    if ddp < float64_exact and zero1 < float64_exact:
        print("NO LONGER REPRODUCES: ZeRO-1 steps float64 parameters in float64")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
