"""World tasks of the kit's own meta-tests (not installed): all-reduce a value, fail on a
replica, inject a fault into a training-shaped loop. Replica hosts import this module by name
(``tests.tasks``), so it works where the repository root is on ``sys.path`` (pytest from it).

Each is ``fn(ctx, **payload)`` and returns picklable data.
"""
from __future__ import annotations

import os
import time


def all_reduce_value(ctx, values) -> list:
    """All-reduce (sum) ``values[ctx.rank]`` with the replica's collectives."""
    import torch
    t = torch.tensor(values[ctx.rank], dtype=torch.float32).to(ctx.device)
    ctx.collectives.all_reduce_(t)
    ctx.mark_step()
    return t.cpu().tolist()


def env_and_parent(ctx, name) -> tuple:
    """``(os.environ.get(name), this host's parent pid)``."""
    return os.environ.get(name), os.getppid()


def fail_on(ctx, rank, how="raise", seconds=30.0) -> int:
    """Misbehave on replica ``rank`` (``None``: every replica): raise, sleep, exit, or block in a collective.

    ``how``: ``raise`` (ValueError), ``sleep`` (``seconds``), ``exit`` (os._exit(3)),
    ``hang_collective`` (every other replica enters an all-reduce that ``rank`` skips).
    """
    if how == "hang_collective":
        if ctx.rank != rank:
            import torch
            ctx.collectives.all_reduce_(torch.ones(1).to(ctx.device))
            ctx.mark_step()
        return ctx.rank
    if rank in (None, ctx.rank):
        if how == "raise":
            raise ValueError(f"boom from replica {rank}")
        if how == "sleep":
            time.sleep(seconds)
        if how == "exit":
            os._exit(3)
    return ctx.rank


FAULTS = ("none", "raise", "exit", "sleep", "skip_collective")


EXIT_DELAY_S = 1.0  # how long an ``exit`` fault waits before exiting (s)


def fault(ctx, rank, how="raise", at_step=1, steps=3, seconds=600.0) -> int:
    """A training-shaped loop with one injected fault: the kit's fault-injection task.

    Every replica runs ``steps`` steps of: ``forward`` (noted with
    ``ctx.note``), an all-reduce of a ``float32[4 + step]`` tensor (sizes differ
    per step, like a DDP's per-parameter all-reduces), ``ctx.mark_step()``.
    Replica ``rank`` misbehaves in the forward of step ``at_step``, by ``how``:
    ``raise`` (``ValueError``), ``exit`` (``os._exit(3)`` after :data:`EXIT_DELAY_S`), ``sleep``
    (``seconds``, i.e. hangs), ``skip_collective`` (skips that step's
    all-reduce), ``none``. Returns the replica's rank.
    """
    import torch
    if how not in FAULTS:
        raise ValueError(f"unknown fault {how!r}; known: {', '.join(FAULTS)}")
    for step in range(steps):
        ctx.note(step=step, phase="forward")
        faulty = ctx.rank == rank and step == at_step
        if faulty and how == "raise":
            raise ValueError(f"injected fault on replica {rank} at step {step}")
        if faulty and how == "exit":
            # dies once its peers wait in the all-reduce (on PJRT they share its process,
            # and a peer still in forward would be as much a suspect as the one that exited)
            time.sleep(EXIT_DELAY_S)
            os._exit(3)
        if faulty and how == "sleep":
            time.sleep(seconds)
        t = torch.full((4 + step,), float(ctx.rank + 1)).to(ctx.device)
        ctx.note(phase="gradient all-reduce")
        if not (faulty and how == "skip_collective"):
            ctx.collectives.all_reduce_(t)
        ctx.mark_step()
        ctx.note(phase="optimizer")
    return ctx.rank


def raise_while_peer_waits(ctx, rank, collective="all_reduce") -> int:
    """Replica ``rank`` raises ValueError; every other replica calls ``torch.distributed``'s
    ``collective`` itself (not the kit's recorded collectives, as a DDP under test does), which
    never completes: the World sees it waiting only in its stack."""
    import torch
    import torch.distributed as dist
    if ctx.rank == rank:
        ctx.note(step=1, phase="forward")
        raise ValueError(f"boom from replica {rank}")
    t = torch.ones(4)
    if collective == "broadcast":
        dist.broadcast(t, src=rank)
    else:
        dist.all_reduce(t)
    return ctx.rank


# --- runtimes whose hosts fail while starting (tests/test_world.py registers them) ---------
from conformance.worlds.runtimes.cpu import CpuRuntime  # noqa: E402  (no torch at import)

STARTING_MARK = "start-up entered by host {host}"


class CrashingAtStart(CpuRuntime):
    """A CPU runtime whose hosts print :data:`STARTING_MARK` and then die of SIGSEGV in their
    start-up, before any task: a crash in C++ code while a runtime initialises."""
    name = "crash_at_start"

    def setup_host(self, host, world_size, workdir):
        import faulthandler
        print(STARTING_MARK.format(host=host), flush=True)
        faulthandler._sigsegv()


class HangingAtStart(CpuRuntime):
    """A CPU runtime whose hosts print :data:`STARTING_MARK`, leave a file ``entered{host}``
    in the world's directory, and then never finish their start-up."""
    name = "hang_at_start"

    def setup_host(self, host, world_size, workdir):
        print(STARTING_MARK.format(host=host), flush=True)
        open(os.path.join(workdir, f"entered{host}"), "w").close()
        time.sleep(3600)


class CrashingOnce(CpuRuntime):
    """A CPU runtime whose host 0 dies of SIGSEGV in its first start-up only: the first start
    leaves the file named by ``CONFORMANCE_TEST_CRASHED`` (in the kit's environment)."""
    name = "crash_once"

    def setup_host(self, host, world_size, workdir):
        import faulthandler
        mark = os.environ["CONFORMANCE_TEST_CRASHED"]
        if host == 0 and not os.path.exists(mark):
            open(mark, "w").close()
            faulthandler._sigsegv()
        return super().setup_host(host, world_size, workdir)


class ExitingAtStart(CpuRuntime):
    """A CPU runtime whose hosts exit with code 3 in their start-up (an exit of its own, not a crash)."""
    name = "exit_at_start"

    def setup_host(self, host, world_size, workdir):
        os._exit(3)


def leak_default_dtype(ctx):
    """Leaves float64 as the process's default dtype (a DDP that leaks a setting)."""
    import torch
    torch.set_default_dtype(torch.float64)
    return str(torch.get_default_dtype())


def read_default_dtype(ctx):
    import torch
    return str(torch.get_default_dtype())
