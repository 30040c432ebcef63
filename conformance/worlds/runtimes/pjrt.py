"""PJRT runtime (torch_xla) on the CPU device: one host process x W replica threads.

This is the TPU v2/v3 shape: one process drives W devices, one Python thread each (as
``torch_xla._internal.pjrt.run_multiprocess`` / ``_run_thread_per_device`` do). The World starts
one host process with ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=W`` and a large ``XLA_THREAD_POOL_SIZE``
(:func:`ddp_impl.runtime.xla.cpu_env`); :meth:`PjrtRuntime.setup_host` sets replication over the
W devices in the host's main thread (as torch_xla's ``initialize_multiprocess``), then starts W
*persistent* replica threads. Thread ``i`` makes ``xla:i`` its default device
(``_xla_set_default_device`` is thread-local, so torch_xla's ordinal queries answer ``i`` in it),
pins its :class:`ddp_impl.runtime.ranks.RankBindings` with ``bind_thread``, keeps its
:class:`ddp_impl.runtime.xla.XlaCollectives` and binds its emulated host
(:mod:`conformance.worlds.runtimes.pjrt_hosts`, ``Settings.pjrt_hosts``). Every task runs in
those same threads, so a replica always sees the same device, bindings and compile cache.

``ctx.mark_step`` is :func:`ddp_impl.runtime.xla.mark_step` - the deadlock-free step sync of
docs/runtimes/pjrt.md (the PJRT CPU causes). Tasks must call it after each optimizer step and
before reading back (``.cpu()``) anything computed from a collective; the adapter calls it once
more after every successful task so no pending graph leaks into the next task.

Failures. A replica that raises is reported to the World at once, while the other replica
threads may still be blocked in a collective it left; the World then kills the host. A replica
that never reaches a collective (hung, or skipped it) is the harder case: XLA:CPU aborts the
whole process when a collective's rendezvous is not complete within its *termination timeout*
(``Termination timeout for `all-reduce` of 10 seconds exceeded ... only 1 of them arrived``,
then SIGABRT). In torch_xla 2.9's XLA that timeout is fixed at about 10 s: the
``xla_cpu_collective_call_terminate_timeout_seconds`` flag of later XLA releases is absent from
its ``_XLAC`` library (checked with ``strings``). The kit's bound is therefore the shorter
:attr:`PjrtRuntime.collective_bound` (``Settings.pjrt_collective_bound``, 6 s), measured from a
replica's entry into ``ctx.mark_step`` (where XLA's lazy collectives run: no later than its
arrival at XLA's rendezvous); past it the World dumps every thread's stack, names the peer as
hung and kills the host before XLA's abort. If XLA aborts anyway (all replicas inside
mismatched collectives), the World reports ``ReplicaDied`` with every replica thread's stack
(``faulthandler``) and the log tail.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
import traceback

from conformance.errors import Unsupported
from conformance.settings import emulated_hosts
from conformance.worlds.runtimes import pjrt_graphs, pjrt_hosts
from conformance.worlds.runtimes.base import ReplicaContext, Runtime, RuntimeUnavailable, run_task

# Bound on the start-up self-test collective (includes one compilation).
STARTUP_TIMEOUT_S = 120.0

_STOP = object()


def flushed(fn):
    """``fn`` followed by ``ctx.mark_step()``: no pending graph leaks into the next task."""
    def with_flush(ctx, **kw):
        value = fn(ctx, **kw)
        ctx.mark_step()
        return value
    with_flush.__name__ = getattr(fn, "__name__", "task")
    return with_flush


class _ReplicaThread:
    """A persistent thread bound to one XLA device that runs tasks on request."""

    def __init__(self, device: str, world_size: int, hosts: int = 1):
        self.device, self.world_size, self.hosts = device, world_size, hosts
        self.inbox, self.outbox = queue.Queue(), queue.Queue()
        self.ctx: ReplicaContext | None = None
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"replica-{device}")
        self.thread.start()

    def _bind(self):
        import torch
        import torch_xla
        from ddp_impl.runtime import ranks, xla
        C = torch_xla._XLAC
        C._xla_set_default_device(self.device)
        # For the thread's life (it runs only this replica's tasks): torch_xla's per-host
        # queries answer as host h of an H-host pod (pjrt_hosts); registered by device too,
        # since autograd runs this replica's hooks and callbacks on a thread of its own.
        ordinal = C._xla_get_default_device_ordinal()
        layout = pjrt_hosts.HostLayout.of(ordinal, self.world_size, self.hosts)
        pjrt_hosts.register(ordinal, layout)
        pjrt_hosts.bind(layout)
        bindings = xla.pjrt_bindings()
        if bindings.world_size != self.world_size:
            raise RuntimeError(f"{self.device}: torch_xla reports world size {bindings.world_size}, "
                               f"expected {self.world_size}")
        ranks.bind_thread(bindings)
        dev = torch.device(self.device)
        self.ctx = ReplicaContext(
            runtime="pjrt", rank=bindings.global_ordinal, world_size=bindings.world_size,
            device=dev, collectives=xla.XlaCollectives(dev, bindings), bindings=bindings,
            mark_step=lambda: xla.mark_step(dev),
            extra={"host": layout.host, "thread": threading.current_thread().name,
                   "thread_ident": threading.get_ident(), "torch_xla_version": torch_xla.__version__})
        pjrt_graphs.register(ordinal, self.ctx)  # a DDP's own step syncs, noted for a death

    def _main(self):
        try:
            self._bind()
            self.outbox.put((True, self.ctx.rank))
        except BaseException:
            self.outbox.put((False, traceback.format_exc()))
            return
        while True:
            item = self.inbox.get()
            if item is _STOP:
                return
            fn, payload, reply, on_raise, task = item
            rank, ok, value = run_task(self.ctx, flushed(fn), payload, on_raise, task)
            if not ok:  # also in the host log at once
                print(f"--- replica {rank} ({self.device}) raised:\n{value['traceback']}",
                      file=sys.stderr, flush=True)
            reply.put((rank, ok, value))


def _self_test(ctx):
    """A tiny all-reduce on every replica: fails fast if collectives cannot meet."""
    import torch
    t = torch.full((2,), float(ctx.rank + 1)).to(ctx.device)
    ctx.collectives.all_reduce_(t)
    ctx.mark_step()
    want = ctx.world_size * (ctx.world_size + 1) / 2
    got = t.cpu().tolist()
    if got != [want, want]:
        raise RuntimeError(f"start-up all_reduce on replica {ctx.rank} gave {got}, expected {want}")
    return got


def xla_process_group(ctx, groups):
    """PJRT has no per-replica torch.distributed group (the replicas are threads of one
    process): the group is the reference's collectives over XLA replica groups (``groups=`` of
    ``xm.all_reduce`` / ``xm.all_gather``), which a DDP takes as ``process_group``."""
    from ddp_impl.runtime.xla import XlaCollectives
    if len({len(g) for g in groups}) > 1:
        raise Unsupported(f"XLA replica groups must have equal sizes (torch_xla 2.9's xm.all_gather: "
                          f"'Replica groups must have the same number of replicas'); W={ctx.world_size} "
                          f"splits into {' + '.join(str(len(g)) for g in groups)}")
    return XlaCollectives(ctx.device, ctx.bindings, groups=groups)


class PjrtRuntime(Runtime):
    """torch_xla PJRT on the CPU device: one host, W replicas as threads."""

    name = "pjrt"
    max_world_size = 16  # the largest world run on PJRT CPU (docs/runtimes/pjrt.md)
    default_impls = ("ref", "xla_recipe", "torch")
    # Emulated hosts of the replica threads (Settings.pjrt_hosts; conformance.worlds.runtimes.pjrt_hosts).
    hosts_field = "pjrt_hosts"
    # spmd: one program over a W-device mesh, in its own host process (use_spmd() is global).
    topologies = {"spmd": "conformance.worlds.runtimes.pjrt_spmd:PjrtSpmdRuntime"}
    make_process_group = staticmethod(xla_process_group)
    collectives_judged = True  # torch_xla's collectives, op by op (conformance.cases.collective.xla)
    # torch_xla 2.9 updates BatchNorm's running_var with the *biased* batch variance (CPU PyTorch:
    # unbiased); pinned by test_pjrt_runtime.py::test_xla_batchnorm_running_var_is_biased.
    reference_quirks = frozenset({"bn_running_var_biased"})
    uniform_graphs = True
    compiled_graphs = True
    @property
    def collective_bound(self) -> float:  # below XLA's abort (module docstring)
        return self.settings.pjrt_collective_bound
    step_sync_runs_collectives = True

    def backend_label(self) -> str:
        return "torch_xla"

    def check(self, world_size):
        super().check(world_size)
        from ddp_impl.runtime.xla import torch_xla_problem
        problem = torch_xla_problem()
        if problem:
            raise RuntimeUnavailable(problem)

    def host_envs(self, world_size):
        from ddp_impl.runtime.xla import cpu_env, fast_compile_flags
        env = cpu_env(world_size)
        # Compile time, not run time, dominates the kit's small graphs (fast_compile_flags).
        env["XLA_FLAGS"] = fast_compile_flags(os.environ.get("XLA_FLAGS", ""))
        # The replica threads' own CPU torch ops (data, sharding) run one intra-op thread each, so
        # W threads do not oversubscribe a small machine; XLA:CPU uses its own pools.
        env.setdefault("OMP_NUM_THREADS", "1")
        return [env]

    def setup_host(self, host, world_size, workdir):
        if host != 0:
            raise RuntimeError(f"the PJRT CPU runtime has one host, got host {host}")
        from ddp_impl.runtime import xla
        torch_xla = xla.require_torch_xla()
        import torch_xla.core.xla_model as xm
        # Initialises the XLA runtime before any task runs: a CPU autograd backward before that
        # breaks later XLA backwards (docs/runtimes/pjrt.md).
        devices = xm.get_xla_supported_devices()
        if len(devices) != world_size:
            raise RuntimeError(f"PJRT CPU exposes {len(devices)} device(s) "
                               f"(CPU_NUM_DEVICES={os.environ.get('CPU_NUM_DEVICES')}), "
                               f"expected {world_size}")
        # As torch_xla._internal.pjrt.initialize_multiprocess: replicate over all.
        xm.set_replication(torch_xla.device(), devices)
        xla.value_independent_graphs()  # rank-dependent values must not change graphs
        # torch_xla registers its torch.distributed backend when this module is first imported: in
        # the world's snapshot, so a DDP that imports it has registered nothing (worlds.isolation)
        import torch_xla.distributed.xla_backend  # noqa: F401
        pjrt_hosts.install()
        pjrt_graphs.install()
        hosts = emulated_hosts(self.settings, world_size, self.name)
        self._threads = threads = [_ReplicaThread(d, world_size, hosts) for d in devices]
        errors = []
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for t in threads:
            try:
                ok, value = t.outbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                ok, value = False, f"did not bind within {STARTUP_TIMEOUT_S:.0f} s"
            if not ok:
                errors.append(f"--- {t.device}:\n{value}")
        if errors:
            raise RuntimeError("PJRT replica threads failed to start:\n" + "\n".join(errors))
        replicas = sorted((t.ctx for t in threads), key=lambda c: c.rank)
        if [c.rank for c in replicas] != list(range(world_size)):
            raise RuntimeError(f"PJRT replica ordinals {[c.rank for c in replicas]} are not 0..{world_size - 1}")
        for rank, ok, value in self.execute(replicas, _self_test, {}, timeout=STARTUP_TIMEOUT_S):
            if not ok:
                raise RuntimeError(f"PJRT start-up collective failed on replica {rank}:\n{value['traceback']}")
        return replicas

    def execute(self, replicas, fn, payload, on_raise=None, task=None, timeout=None):
        """Run the task on every replica thread; ``on_raise`` is called from the raising thread at
        once. Without ``timeout`` the wait is bounded by the World, which kills this host; with it
        (start-up), unfinished replicas raise ``TimeoutError``."""
        by_rank = {t.ctx.rank: t for t in self._threads}
        reply: queue.Queue = queue.Queue()  # fresh per task: no stale answers
        for c in replicas:
            by_rank[c.rank].inbox.put((fn, payload, reply, on_raise, task))
        deadline = None if timeout is None else time.monotonic() + timeout
        results = {}
        while len(results) < len(replicas):
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                rank, ok, value = reply.get(timeout=left)
            except queue.Empty:
                missing = sorted(c.rank for c in replicas if c.rank not in results)
                raise TimeoutError(f"PJRT replica(s) {missing} did not finish within {timeout:.0f} s") from None
            results[rank] = (ok, value)
        return [(c.rank, *results[c.rank]) for c in replicas]

    def teardown_host(self, replicas):
        for t in getattr(self, "_threads", []):
            t.inbox.put(_STOP)
        for t in getattr(self, "_threads", []):
            t.thread.join(5.0)
        pjrt_hosts.clear()
        pjrt_graphs.clear()
