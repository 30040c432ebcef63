"""Finding: DistributedDataParallel(static_graph=True) never all-reduces the first iteration's
gradients when the module returns a plain dataclass (torch 2.13 CPU, gloo). Silent: each replica
steps with its own gradient and the replicas differ from then on. Known upstream:
pytorch/pytorch#106690 (HF's ModelOutput; transformers registers it as a pytree node since), a
test showing it: pytorch/pytorch#93125.

Run: python static_graph_dataclass_output.py   (2 processes, gloo, FileStore)
Exit 0: reproduces (with a dataclass output the first backward leaves each replica its local
gradient, while a tensor output and static_graph=False give the mean); 3: the first iteration
is all-reduced now; 4: anything else.
"""
import dataclasses
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
TIMEOUT_S = 600  # spawn + import under load is slow; a hang is bounded


@dataclasses.dataclass
class Output:
    pred: torch.Tensor


class Net(torch.nn.Module):
    def __init__(self, dataclass_output):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.dataclass_output = dataclass_output

    def forward(self, x):
        y = self.lin(x)
        return Output(y) if self.dataclass_output else y


def deviation(static_graph, dataclass_output, rank):
    """Largest |DDP gradient - mean of the replicas' local gradients| after the first backward."""
    torch.manual_seed(0)
    module = Net(dataclass_output)
    model = torch.nn.parallel.DistributedDataParallel(module, static_graph=static_graph)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))
    out = model(x)
    (out.pred if dataclass_output else out).pow(2).sum().backward()
    local = Net(False)
    local.load_state_dict({k: v for k, v in module.state_dict().items()})
    local(x).pow(2).sum().backward()
    mean = local.lin.weight.grad.clone()
    dist.all_reduce(mean)
    mean /= WORLD_SIZE
    return float((module.lin.weight.grad - mean).abs().max())


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank,
                            world_size=WORLD_SIZE)
    results = [deviation(False, True, rank), deviation(True, False, rank), deviation(True, True, rank)]
    with open(f"{out}.{rank}", "w") as f:
        f.write(" ".join(map(repr, results)))
    dist.destroy_process_group()


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
    rows = [list(map(float, open(os.path.join(d, f"out.{r}")).read().split())) for r in range(WORLD_SIZE)]
    dynamic, tensor, dataclass = (max(r[i] for r in rows) for i in range(3))
    print(f"static_graph=False, dataclass output: max |grad - mean| = {dynamic:.3g}")
    print(f"static_graph=True, tensor output: max |grad - mean| = {tensor:.3g}")
    print(f"static_graph=True, dataclass output: max |grad - mean| = {dataclass:.3g}")
    print(f"torch {torch.__version__}")
    exact = 1e-6
    if dynamic < exact and tensor < exact and dataclass > 1e-3:
        print("REPRODUCED: static_graph=True leaves the first iteration's gradients unreduced "
              "behind a dataclass output")
        return 0
    if dynamic < exact and tensor < exact and dataclass < exact:
        print("NO LONGER REPRODUCES: the first iteration is all-reduced with a dataclass output")
        return 3
    return 4


if __name__ == "__main__":
    sys.exit(main())
