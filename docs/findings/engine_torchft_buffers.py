"""Finding: torchft 0.2.0's DistributedDataParallel never broadcasts buffers before a forward (it
runs torch's DDP over a one-rank dummy process group; only gradients travel, through its comm
hook), and its manager's step-0 heal copies the first replica's whole state dict, buffers
included, even with ``broadcast_buffers=False``. torch's DistributedDataParallel broadcasts rank
0's buffers before every forward with ``broadcast_buffers=True`` and leaves each rank its own
with ``broadcast_buffers=False``. Each replica is one torchft replica group; the lighthouse its
wheel ships runs in rank 0's process. torch 2.13 CPU, gloo, 2 processes.

Run: python engine_torchft_buffers.py
Exit 0: both reproduce; 3: torchft behaves as torch's DDP now; 4: anything else (torchft missing).
"""
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
TIMEOUT_S = 600
FT_TIMEOUT = timedelta(seconds=60)


class Net(torch.nn.Module):
    def __init__(self, rank):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("b", torch.full((2,), float(rank)))  # rank-specific buffer

    def forward(self, x):
        return self.lin(x) + self.b


def torch_ddp(m, rank, **kw):
    return torch.nn.parallel.DistributedDataParallel(m, **kw), lambda: None


def torchft_ddp(m, rank, **kw):
    """torchft's DDP over a manager, its first quorum formed (the step-0 heal) on return."""
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from torchft._torchft import LighthouseServer
    lighthouse, address = None, [None]
    if rank == 0:
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=WORLD_SIZE)
        address = [lighthouse.address()]
    dist.broadcast_object_list(address, src=0)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=FT_TIMEOUT), min_replica_size=WORLD_SIZE,
                      load_state_dict=m.load_state_dict, state_dict=m.state_dict, replica_id=f"r{rank}",
                      lighthouse_addr=address[0], store_addr="127.0.0.1", store_port=store.port, rank=0,
                      world_size=1, timeout=FT_TIMEOUT, quorum_timeout=FT_TIMEOUT, connect_timeout=FT_TIMEOUT,
                      use_async_quorum=False)
    ddp = DistributedDataParallel(manager, m, **kw)
    manager.start_quorum()
    dist.barrier()

    def close():
        dist.barrier()
        manager.shutdown()
        if lighthouse is not None:
            lighthouse.shutdown()
    return ddp, close


def replica(rank, path, out):
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    seen = []
    for name, wrap in (("torch", torch_ddp), ("torchft", torchft_ddp)):
        m = Net(rank)
        ddp, close = wrap(m, rank, broadcast_buffers=False)
        seen.append(f"{name}:construction_off={m.b[0].item():g}")
        close()
        m = Net(rank)
        ddp, close = wrap(m, rank, broadcast_buffers=True)
        m.b.fill_(10.0 + rank)  # the ranks' buffers diverge after construction
        ddp(torch.ones(1, 2)).sum().backward()
        seen.append(f"{name}:forward={m.b[0].item():g}")
        close()
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
    except Exception as exc:  # a replica raised (torchft missing)
        print(f"replica failed: {exc}")
        return 4
    got = dict(kv.split("=") for kv in open(os.path.join(d, "out.1")).read().split())
    print("rank 1's buffer (its own: 1 at construction, 11 before the forward):", got)
    construction = got["torch:construction_off"] == "1" and got["torchft:construction_off"] == "0"
    forward = got["torch:forward"] == "10" and got["torchft:forward"] == "11"
    if construction and forward:
        print("REPRODUCED: torchft copies buffers at its step-0 heal with broadcast_buffers=False, "
              "and broadcasts none before a forward")
        return 0
    same = got["torch:construction_off"] == got["torchft:construction_off"] and \
        got["torch:forward"] == got["torchft:forward"]
    return 3 if same else 4


if __name__ == "__main__":
    sys.exit(main())
