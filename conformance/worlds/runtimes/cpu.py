"""CPU runtime: plain PyTorch, one process per replica, gloo process group.

Rendezvous is a ``FileStore`` in the world's private directory (no TCP port, so pytest-xdist
workers cannot clash). Each process uses one intra-op thread so W replicas do not oversubscribe
a small machine.
"""
from __future__ import annotations

import datetime
import importlib
import os
import socket

from conformance.errors import Unsupported, UsageError
from conformance.settings import emulated_hosts
from conformance.worlds.runtimes.base import ReplicaContext, Runtime
from conformance.worlds.launchers import replica_envs

# How far gloo's timeout stays above a World's task bound: the World's stack dump
# (at most 3 s) and teardown happen before any replica's gloo timeout fires.
PG_TIMEOUT_MARGIN_S = 30.0


def resolve_backend(spec: str) -> str:
    """The torch.distributed backend name ``spec`` stands for, registered in this process.

    ``spec``: a name torch knows (``gloo``; ``Backend.backend_list``) or ``module:function``; the
    function takes no argument, registers a backend with ``torch.distributed.Backend.register_backend``
    and may return its name (else the one name it added to ``Backend.backend_list`` is taken).

    Raises:
        UsageError: a module that does not import, a function that is missing, raises or
            registers nothing, a name torch does not know or cannot run here (one line).
    """
    import torch.distributed as dist
    mod_name, colon, func_name = spec.partition(":")
    if not colon:
        name = spec.strip().lower()
        if name not in dist.Backend.backend_list or name == "undefined":
            raise UsageError(f"--backend {spec!r}: unknown torch.distributed backend; known: "
                             f"{', '.join(b for b in dist.Backend.backend_list if b != 'undefined')}, or "
                             "module:function registering one")
        available = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available,
                     "mpi": dist.is_mpi_available, "ucc": dist.is_ucc_available}.get(name)
        if available is not None and not available():
            raise UsageError(f"--backend {spec!r}: this torch has no {name} backend")
        return name
    try:
        func = getattr(importlib.import_module(mod_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--backend {spec!r}: cannot load {func_name!r} from {mod_name!r}: "
                         f"{type(exc).__name__}: {exc}") from None
    before = set(dist.Backend.backend_list)
    try:
        got = func()
    except Exception as exc:
        raise UsageError(f"--backend {spec!r}: {func_name}() raised {type(exc).__name__}: {exc}") from None
    added = sorted(set(dist.Backend.backend_list) - before)
    name = got.lower() if isinstance(got, str) else (added[0] if len(added) == 1 else None)
    if name is None or name not in dist.Backend.backend_list:
        raise UsageError(f"--backend {spec!r}: {func_name}() registered no backend (return its name, or "
                         "call torch.distributed.Backend.register_backend once)")
    return name


def process_group_timeout_s(settings) -> float:
    """gloo's timeout in seconds for a world of ``settings`` (:class:`conformance.settings.Settings`):
    ``settings.collective_timeout``, raised to ``settings.replica_timeout + PG_TIMEOUT_MARGIN_S``.
    Above the task bound, so the World takes every replica's stack and decides who hung; below
    it, a replica waiting in a collective the kit does not instrument would raise gloo's "Timed
    out waiting" first and be reported as the replica that failed."""
    return max(settings.collective_timeout, settings.replica_timeout + PG_TIMEOUT_MARGIN_S)


def _cut_tcp_connections() -> None:
    """Shut down every connected TCP socket of this process (Linux: listed in ``/proc/self/fd``)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except OSError:  # closed meanwhile
            continue
        try:
            # not a listener: gloo's listener thread aborts the process when its accept fails
            if (s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM
                    and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                s.shutdown(socket.SHUT_RDWR)  # the connection, for every descriptor of it
        except OSError:  # not connected
            pass
        finally:
            s.close()  # our duplicate only


def torch_process_group(ctx, groups):
    """This rank's ``torch.distributed.new_group``; every rank creates every group, in order."""
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() != ctx.world_size:
        raise Unsupported(f"process subgroups are torch.distributed groups (new_group); the {ctx.runtime} "
                          "world's replicas are not the ranks of one torch.distributed world")
    mine = None
    for ranks in groups:
        g = dist.new_group(ranks)
        if ctx.rank in ranks:
            mine = g
    return mine


class CpuRuntime(Runtime):
    name = "cpu"
    max_world_size = 16
    default_impls = ("torch", "ref")
    # Emulated hosts (Settings.cpu_hosts; torchrun's LOCAL_*/GROUP_* variables per host).
    hosts_field = "cpu_hosts"
    launchable = True  # one replica per process: a launcher's processes are the world
    collectives_judged = True  # torch.distributed's collectives, op by op (conformance.cases.collective)
    make_process_group = staticmethod(torch_process_group)
    @property
    def collective_bound(self) -> float:
        # below gloo's own timeout (never below collective_timeout): a waiter left by a hung peer
        # would otherwise raise gloo's "Timed out waiting ... for recv" first and be blamed
        return 0.8 * self.settings.collective_timeout

    def backend_label(self) -> str:
        return self.settings.backend  # gloo, or the --backend under test

    def host_envs(self, world_size):
        """One replica per process, grouped into :func:`conformance.settings.emulated_hosts`
        hosts, each with the variables the world size's launcher gives it
        (:mod:`conformance.worlds.launchers`; torchrun: node = ``GROUP_RANK``)."""
        hosts = emulated_hosts(self.settings, world_size, self.name)
        return [dict(env, OMP_NUM_THREADS="1") for env in replica_envs(world_size, hosts)]

    def setup_host(self, host, world_size, workdir):
        import torch
        import ddp_impl
        torch.set_num_threads(1)
        self._place = (host, world_size)  # one replica per host process: host index = rank
        self._init_group(workdir, "rendezvous")
        b = ddp_impl.runtime.ranks.bindings()
        return [ReplicaContext(runtime=self.name, rank=b.global_ordinal, world_size=b.world_size, bindings=b,
                               device=torch.device("cpu"), collectives=ddp_impl.TorchDistributedCollectives())]

    def _init_group(self, workdir, name):
        # rank and world size passed as mp.spawn's scripts do: not every launcher sets RANK / WORLD_SIZE
        import torch.distributed as dist
        rank, world_size = self._place
        dist.init_process_group(
            resolve_backend(self.settings.backend), init_method=f"file://{os.path.join(workdir, name)}",
            rank=rank, world_size=world_size,
            timeout=datetime.timedelta(seconds=process_group_timeout_s(self.settings)))

    resettable = True

    def reset_host(self, replicas, generation, workdir):
        """Destroy every process group of this host, cut its TCP connections, then rendezvous
        anew. A cut connection makes a peer still blocked in a collective raise gloo's
        "Connection closed by peer" at once, so it returns to its task loop and resets too; the
        new group starts with no message of the failed task in flight. Destroying alone does not
        cut them while anything still holds the group (``torch.distributed.nn.functional``,
        imported after init, keeps ``group.WORLD`` as its functions' default argument). A
        kit-spawned world has no other TCP sockets (its rendezvous is a file, its pipes are Unix
        sockets). Why and how fast: docs/robustness.md "A raise keeps the world"."""
        self.teardown_host(replicas)
        _cut_tcp_connections()
        self._init_group(workdir, f"rendezvous.{generation}")

    def teardown_host(self, replicas):
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
