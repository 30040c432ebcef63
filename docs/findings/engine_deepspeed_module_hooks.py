"""Finding: DeepSpeed 0.19.8's ``deepspeed.initialize`` (ZeRO 0-2) registers a forward pre-hook
and a forward hook on the user's module and leaves them there: code that inspects or relies on
the module's hooks (a hook count, ``_forward_hooks`` emptied by another library, the module
moved to a second wrapper) sees DeepSpeed's. torch's DistributedDataParallel adds none to the
module it wraps. torch 2.13 CPU, gloo (DeepSpeed's CPU accelerator without oneCCL).

Run: python engine_deepspeed_module_hooks.py   (2 processes, gloo, FileStore)
Exit 0: reproduces; 3: DeepSpeed leaves the module's hooks alone now; 4: anything else
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


def hooks_added(wrap):
    """(forward pre-hooks, forward hooks) the wrapper left on a fresh nn.Linear."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    pre, post = len(net._forward_pre_hooks), len(net._forward_hooks)
    wrap(net)
    return len(net._forward_pre_hooks) - pre, len(net._forward_hooks) - post


def replica(rank, path, out):
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("gloo", store=dist.FileStore(path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
    import deepspeed
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 0}}
    ddp = hooks_added(torch.nn.parallel.DistributedDataParallel)
    ds = hooks_added(lambda m: deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                                                    config=config))
    with open(f"{out}.{rank}", "w") as f:
        f.write(" ".join(map(str, ddp + ds)))
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
    ddp_pre, ddp_post, ds_pre, ds_post = (int(v) for v in open(os.path.join(d, "out.0")).read().split())
    print(f"hooks added to the module (forward pre, forward): torch DDP ({ddp_pre}, {ddp_post}), "
          f"DeepSpeed ({ds_pre}, {ds_post})")
    if (ddp_pre, ddp_post) == (0, 0) and ds_pre + ds_post > 0:
        print("REPRODUCED: DeepSpeed left its hooks on the user's module")
        return 0
    return 3 if (ds_pre, ds_post) == (0, 0) else 4


if __name__ == "__main__":
    sys.exit(main())
