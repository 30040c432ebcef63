"""Finding: DeepSpeed 0.19.8 (ZeRO 0-3) raises at the first step on workload corners torch's
DistributedDataParallel trains: a channels_last convolution weight, a float64 model (ZeRO-0), a
layer of another dtype between float32 layers (ZeRO-1-3), a sparse embedding gradient (ZeRO-1-3). torch
2.13 CPU, gloo (DeepSpeed's CPU accelerator without oneCCL).

Run: python engine_deepspeed_workload_corners.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (torch's DDP steps every corner; DeepSpeed raises on each listed pair);
3: DeepSpeed steps every listed pair now; 4: anything else (deepspeed missing, a partial change).
The first run builds DeepSpeed's deepspeed_shm_comm extension (about 40 s on a quiet machine).
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
#: (corner, ZeRO stage) pairs measured to raise.
RAISES = [("channels_last", 0), ("channels_last", 1), ("channels_last", 2), ("channels_last", 3), ("float64", 0),
          ("mixed_dtype", 1), ("mixed_dtype", 2), ("mixed_dtype", 3), ("sparse", 1), ("sparse", 2), ("sparse", 3)]


class Mixed(torch.nn.Module):
    """float32 -> bfloat16 -> float32 layers."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).bfloat16(), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.c(self.b(self.a(x).bfloat16()).float())


def corner(name):
    """(module, input) of a workload corner."""
    torch.manual_seed(0)
    if name == "channels_last":
        return torch.nn.Conv2d(3, 4, 2).to(memory_format=torch.channels_last), torch.randn(2, 3, 4, 4)
    if name == "float64":
        return torch.nn.Linear(4, 2).double(), torch.randn(2, 4, dtype=torch.float64)
    if name == "mixed_dtype":
        return Mixed(), torch.randn(2, 4)
    return torch.nn.Embedding(10, 3, sparse=True), torch.tensor([[1, 2], [3, 4]])


def one_step(name, stage, deepspeed):
    """'' when one step of ``name`` runs (torch's DDP when ``stage`` is None), else the error's first line."""
    model, x = corner(name)
    try:
        if stage is None:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ddp(x).float().pow(2).mean().backward()
            opt.step()
        else:
            config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                      "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
            engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                              config=config)
            engine.backward(engine(x).float().pow(2).mean())
            engine.step()
        return ""
    except Exception as exc:  # the finding is which corner raises, whatever the type
        return (type(exc).__name__ + ": " + (str(exc).splitlines() or [""])[0])[:100]


def replica(rank, path, out):
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    import deepspeed
    rows = []
    for name in ("channels_last", "float64", "mixed_dtype", "sparse"):
        rows.append(f"{name}\tddp\t{one_step(name, None, deepspeed)}")
        for stage in (0, 1, 2, 3):
            rows.append(f"{name}\t{stage}\t{one_step(name, stage, deepspeed)}")
    with open(f"{out}.{rank}", "w") as f:
        f.write("\n".join(rows))
    os._exit(0)  # a failed engine may hold the group: do not wait on teardown


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
    got = {}
    for line in open(os.path.join(d, "out.0")).read().splitlines():
        name, who, err = (line.split("\t") + [""])[:3]
        got[(name, who)] = err
        print(f"{name:13s} {'torch DDP' if who == 'ddp' else 'ZeRO-' + who:9s} {err or 'steps'}")
    ddp_ok = all(not err for (name, who), err in got.items() if who == "ddp")
    raised = [pair for pair in RAISES if got.get((pair[0], str(pair[1])))]
    if ddp_ok and len(raised) == len(RAISES):
        print("REPRODUCED: DeepSpeed raises on every listed corner torch's DDP trains")
        return 0
    if ddp_ok and not raised:
        print("NO LONGER REPRODUCES: DeepSpeed steps every listed corner")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
