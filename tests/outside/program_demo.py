"""Two-process demonstrations (torch.multiprocessing + gloo): each faulty DDP of program_faults.py
against torch's DDP (and the control) in the targeted program/world ("situation") and in
ordinary use. Prints, per fault, whether the final parameters of every rank are bit-identical
to torch's DDP run of the same program.

usage: python tests/outside/program_demo.py [name ...]     (names: see FAULTS below; default all)
"""
import datetime
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.outside import program_faults as faults  # noqa: E402
from tests.outside.program_control import ControlDDP  # noqa: E402

W = 2


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def init(rank, world, port, timeout=60):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 6, generator=g)


def train(ddp, opt, rank, steps, start=0):
    for s in range(start, start + steps):
        ddp(batch(rank, s)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def flat(module):
    return torch.cat([t.detach().flatten().double() for t in module.state_dict().values()])


# ----------------------------------------------------------------------------- programs
# each program(rank, Cls, situation) -> flat state of the model on that rank, inside a world
# of W=2 initialised by the harness (except the programs that drive the world themselves).

def p_plain(rank, Cls, situation):
    m = make_model()
    d = Cls(m)
    opt = torch.optim.SGD(d.parameters(), lr=0.1, momentum=0.9)
    train(d, opt, rank, 4)
    with d.no_sync():
        d(batch(rank, 9)).sum().backward()
    train(d, opt, rank, 1, start=10)
    return flat(m)


def p_state_dict(rank, Cls, situation):
    m = make_model()
    d = Cls(m)
    opt = torch.optim.SGD(d.parameters(), lr=0.1, momentum=0.9)
    train(d, opt, rank, 2)
    if situation:
        if rank == 0:  # the tutorial pattern: save on rank 0 only
            torch.save(d.state_dict(), os.path.join(tempfile.gettempdir(), "demo_ckpt.pt"))
    else:
        d.state_dict()  # every rank (ordinary use)
    train(d, opt, rank, 2, start=2)
    return flat(m)


def p_rewrap(rank, Cls, situation):
    m = make_model()
    for p in m[0].parameters():
        p.requires_grad_(False)  # frozen backbone at wrap time
    d = Cls(m)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
    train(d, opt, rank, 2)
    for p in m[0].parameters():
        p.requires_grad_(True)
    if situation:
        d = Cls(d.module)  # unfreeze and re-wrap (the fix the forum recommends)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        train(d, opt, rank, 2, start=2)
    return flat(m)


def p_second(rank, Cls, situation):
    m = make_model()
    d = Cls(m)
    opt = torch.optim.SGD(d.parameters(), lr=0.1)
    train(d, opt, rank, 2)
    if not situation:
        return flat(m)
    # second trial in the same world: RNG diverged by rank (per-rank augmentation seed)
    m2 = make_model(seed=100 + rank)
    d2 = Cls(m2)
    opt2 = torch.optim.SGD(d2.parameters(), lr=0.1)
    train(d2, opt2, rank, 2)
    return flat(m2)


def p_nograd(rank, Cls, situation):
    m = make_model()
    d = Cls(m)
    opt = torch.optim.SGD(d.parameters(), lr=0.1)
    for s in range(3):
        out = d(batch(rank, s))
        if situation:
            with torch.no_grad():  # pseudo-targets from the same model, mid-step
                tgt = d(batch(rank, s) * 0.5)
        else:
            tgt = torch.zeros_like(out)
        (out.pow(2).mean() + (out - tgt).pow(2).mean()).backward()
        opt.step()
        opt.zero_grad()
        if not situation:
            with torch.no_grad():
                d(batch(rank, 50 + s))  # validation between steps
    return flat(m)


# ----------------------------------------------------------------------------- harness

def worker(rank, port, program, classes, situation, env, out_dir, timeout):
    os.environ.update(env)
    init(rank, W, port, timeout)
    for name in classes:
        Cls = resolve(name)
        try:
            res = program(rank, Cls, situation)
        except Exception as e:  # a hang/timeout or a collective mismatch
            res = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        torch.save(res, os.path.join(out_dir, f"{name}.{rank}.pt"))
        if isinstance(res, str):
            break
    try:
        dist.destroy_process_group()
    except Exception:
        pass


def worker_reinit(rank, port1, port2, classes, situation, out_dir):
    """CachedWorld: a world of 2, destroyed; then (situation) rank 0 alone rebuilds a world of 1
    in the same process and trains again; (ordinary) only the first world."""
    init(rank, 2, port1)
    results = {}
    for name in classes:
        Cls = resolve(name)
        m = make_model()
        d = Cls(m)
        opt = torch.optim.SGD(d.parameters(), lr=0.1)
        train(d, opt, rank, 2)
        results[name] = flat(m)
    dist.destroy_process_group()
    if situation:
        if rank != 0:
            return
        init(0, 1, port2)
        for name in classes:
            Cls = resolve(name)
            m = make_model()
            d = Cls(m)
            opt = torch.optim.SGD(d.parameters(), lr=0.1)
            train(d, opt, 0, 2)
            results[name] = flat(m)
        dist.destroy_process_group()
    for name, r in results.items():
        torch.save(r, os.path.join(out_dir, f"{name}.{rank}.pt"))


def resolve(name):
    if name == "torch":
        return TorchDDP
    if name == "control":
        return ControlDDP
    return getattr(faults, name)


FAULTS = {
    # name: (class, program, env in the situation)
    "EnvWorldSizeDDP": (p_plain, {"WORLD_SIZE": "1"}),   # pod-level WORLD_SIZE (1 pod)
    "EnvRankDDP": (p_plain, {"RANK": "0"}),              # pod-level RANK (pod 0)
    "CachedWorldDDP": (None, {}),
    "StateDictCollectiveDDP": (p_state_dict, {}),
    "RewrapDDP": (p_rewrap, {}),
    "SecondWrapDDP": (p_second, {}),
    "NoGradMidStepDDP": (p_nograd, {}),
}


def run_case(fault, situation):
    program, env = FAULTS[fault]
    out = tempfile.mkdtemp(prefix="ddpdemo")
    classes = ["torch", "control", fault]
    if program is None:
        mp.spawn(worker_reinit, args=(free_port(), free_port(), classes, situation, out), nprocs=W)
        ranks = [0] if situation else list(range(W))
    else:
        env = env if situation else {}
        timeout = 15 if fault == "StateDictCollectiveDDP" else 60
        # the faulty class last: a broken world cannot spoil the torch/control runs
        mp.spawn(worker, args=(free_port(), program, classes, situation, env, out, timeout), nprocs=W)
        ranks = list(range(W))
    res = {}
    for c in classes:
        res[c] = [torch.load(os.path.join(out, f"{c}.{r}.pt")) if os.path.exists(os.path.join(out, f"{c}.{r}.pt")) else "missing"
                  for r in ranks]
    def same(a, b):
        return all(torch.is_tensor(x) and torch.is_tensor(y) and torch.equal(x, y) for x, y in zip(a, b))
    def dev(a, b):
        ds = []
        for x, y in zip(a, b):
            ds.append(f"{(x - y).abs().max().item():.3g}" if torch.is_tensor(x) and torch.is_tensor(y) else str(x if not torch.is_tensor(x) else y))
        return ds
    return same(res["torch"], res["control"]), same(res["torch"], res[fault]), dev(res["torch"], res[fault])


if __name__ == "__main__":
    names = sys.argv[1:] or list(FAULTS)
    for f in names:
        for situation in (False, True):
            ctl, ok, d = run_case(f, situation)
            label = "situation" if situation else "ordinary "
            print(f"{f:24s} {label}: control==torch {ctl}; faulty==torch {ok}; max|faulty-torch| per rank {d}", flush=True)
