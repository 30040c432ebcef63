"""Finding: fairscale 0.4.13's ShardedDataParallel broadcasts buffers where torch's
DistributedDataParallel does not, and skips a broadcast torch's makes:

* at construction it broadcasts rank 0's whole ``state_dict()`` (``sync_models_at_startup``),
  buffers included, even with ``broadcast_buffers=False``; torch's DDP leaves each rank its own
  buffers then;
* a forward under ``no_sync()`` broadcasts no buffers (its forward skips ``sync_buffers`` while
  accumulating gradients); torch's DDP with ``broadcast_buffers=True`` broadcasts rank 0's
  buffers before every forward, inside ``no_sync()`` too.

torch 2.13 CPU, gloo, 2 processes.
Run: python engine_fairscale_buffers.py
Exit 0: both reproduce; 3: fairscale behaves as torch's DDP now; 4: anything else (fairscale missing).
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


class Net(torch.nn.Module):
    def __init__(self, rank):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("b", torch.full((2,), float(rank)))  # rank-specific buffer

    def forward(self, x):
        return self.lin(x) + self.b


def wrappers():
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim.oss import OSS

    def fairscale(m, **kw):
        return ShardedDataParallel(m, OSS(m.parameters(), optim=torch.optim.SGD, lr=0.1), **kw)
    return {"torch": torch.nn.parallel.DistributedDataParallel, "fairscale": fairscale}


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    seen = []
    for name, wrap in wrappers().items():
        m = Net(rank)
        ddp = wrap(m, broadcast_buffers=False)
        seen.append(f"{name}:construction_off={m.b[0].item():g}")
        m = Net(rank)
        ddp = wrap(m, broadcast_buffers=True)
        m.b.fill_(10.0 + rank)  # the ranks' buffers diverge after construction
        with ddp.no_sync():
            ddp(torch.ones(1, 2)).sum().backward()
        seen.append(f"{name}:no_sync_forward={m.b[0].item():g}")
    with open(f"{out}.{rank}", "w") as f:
        f.write(" ".join(seen))
    dist.destroy_process_group()
    os._exit(0)


def main():
    d = tempfile.mkdtemp()
    ctx = mp.start_processes(replica, args=(os.path.join(d, "store"), os.path.join(d, "out")),
                             nprocs=WORLD_SIZE, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print(f"TIMEOUT after {TIMEOUT_S} s")
                return 4
    except Exception as exc:  # a replica raised (fairscale missing)
        print(f"replica failed: {exc}")
        return 4
    got = dict(kv.split("=") for kv in open(os.path.join(d, "out.1")).read().split())
    print("rank 1's buffer (its own: 1 at construction, 11 before the no_sync forward):", got)
    construction = got["torch:construction_off"] == "1" and got["fairscale:construction_off"] == "0"
    no_sync = got["torch:no_sync_forward"] == "10" and got["fairscale:no_sync_forward"] == "11"
    if construction and no_sync:
        print("REPRODUCED: fairscale broadcasts buffers at construction with broadcast_buffers=False, "
              "and none in a forward under no_sync()")
        return 0
    same = got["torch:construction_off"] == got["fairscale:construction_off"] and \
        got["torch:no_sync_forward"] == got["fairscale:no_sync_forward"]
    return 3 if same else 4


if __name__ == "__main__":
    sys.exit(main())
