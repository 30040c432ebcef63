"""Finding: torch_xla's copying collectives on the PJRT CPU device do not copy every value bit for
bit (torch_xla 2.9, PJRT_DEVICE=CPU, 2 replicas as threads of one process):

* xm.all_gather, xm.all_to_all and xm.collective_permute return +0.0 where a replica sent -0.0
  (inf, NaN and every other value arrive intact);
* xm.collective_broadcast returns NaN on every replica where the root holds +-inf, and +0.0 where
  it holds -0.0: it is a masked all-reduce (each replica multiplies by 1 or 0, then SUM), and
  inf * 0 = NaN, -0.0 + 0.0 = +0.0.

No error, no warning. torch.distributed's broadcast and all_gather over gloo keep both. The
control: the same values moved to the device and back without a collective keep their bits.

Run: python xla_cpu_collectives_signed_zero_and_inf.py   (needs torch_xla 2.9; one process)
Exit 0: reproduces; 3: every op copies the values exactly now; 4: anything else (including a
control that fails, or a timeout).

The replica threads use the step sync of docs/runtimes/pjrt.md (torch_xla.sync() can deadlock on
the GIL with several replica threads): a process-wide lock around the step marker, so every
replica runs one executable, then a wait that releases the GIL, then the all-reduce token reset.
These are private torch_xla 2.9 APIs.
"""
import math
import os
import sys
import threading

WORLD_SIZE = 2
TIMEOUT_S = 300
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ["CPU_NUM_DEVICES"] = str(WORLD_SIZE)
os.environ.setdefault("XLA_THREAD_POOL_SIZE", "16")

import torch  # noqa: E402

try:
    import torch_xla  # noqa: E402
    import torch_xla.core.xla_model as xm  # noqa: E402
except ImportError as exc:
    print(f"torch_xla is not installed: {exc}")
    sys.exit(4)

C = torch_xla._XLAC
LOCK = threading.Lock()
#: what each replica sends: -0.0, +inf, -inf, NaN, 1.5 (its rank added to the last)
VALUES = [-0.0, math.inf, -math.inf, math.nan, 1.5]


def step(dev):
    """The deadlock-free step sync (docs/runtimes/pjrt.md, torch_xla 2.9 private APIs)."""
    try:
        token = C._get_all_reduce_token(dev)
    except IndexError:
        token = None
    with LOCK:
        C._xla_step_marker(dev, [], wait=False)
    C._xla_wait_device_ops(C._xla_real_devices([dev]))
    del token
    C._set_all_reduce_token(dev, None)


def bits(t):
    """Each value with its sign, so -0.0 and +0.0 differ (NaN == NaN)."""
    return [("nan" if math.isnan(v) else f"{math.copysign(1, v):+.0f}*{abs(v)}") for v in t.tolist()]


def replica(device, results):
    C._xla_set_default_device(device)
    dev = torch.device(device)
    rank = C._xla_get_default_device_ordinal()
    mine = torch.tensor(VALUES[:-1] + [VALUES[-1] + rank])
    x = mine.to(dev)  # per-replica values as device data: every replica builds the same graph
    out = {"control": x * 1.0,
           "all_gather": xm.all_gather(x, dim=0, pin_layout=False),
           "all_to_all": xm.all_to_all(torch.cat([x, x]), 0, 0, WORLD_SIZE),
           "collective_permute": xm.collective_permute(x, [[0, 1], [1, 0]])}
    b = x.clone()
    xm.collective_broadcast([b], root_ordinal=0)
    out["collective_broadcast"] = b
    step(str(dev))
    got = {k: bits(v.cpu()) for k, v in out.items()}
    sent = [torch.tensor(VALUES[:-1] + [VALUES[-1] + r]) for r in range(WORLD_SIZE)]
    want = {"control": bits(mine), "all_gather": bits(torch.cat(sent)),
            "all_to_all": bits(torch.cat([sent[r] for r in range(WORLD_SIZE)])),
            "collective_permute": bits(sent[(rank - 1) % WORLD_SIZE]),
            "collective_broadcast": bits(sent[0])}
    results[rank] = (got, want)


def main():
    devices = xm.get_xla_supported_devices()
    xm.set_replication(torch_xla.device(), devices)
    C._set_xla_handle_special_scalars(False)  # rank-dependent 0/1 must not become constants
    C._set_xla_enable_device_data_cache(False)
    results = {}
    threads = [threading.Thread(target=replica, args=(d, results), daemon=True) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    if len(results) != WORLD_SIZE:
        print("timed out or a replica raised")
        return 4
    wrong = set()
    for rank in range(WORLD_SIZE):
        got, want = results[rank]
        for op in want:
            bad = [(i, g, w) for i, (g, w) in enumerate(zip(got[op], want[op])) if g != w]
            print(f"replica {rank} {op}: {'ok' if not bad else 'WRONG ' + str(bad)}")
            if bad:
                wrong.add(op)
    if "control" in wrong:
        return 4
    print("wrong:", sorted(wrong))
    if wrong == {"all_gather", "all_to_all", "collective_permute", "collective_broadcast"}:
        return 0
    return 3 if not wrong else 4


if __name__ == "__main__":
    sys.exit(main())
