"""Rank bindings of the legacy XRT runtime (torch_xla 1.x and 2.0), read from the environment.

XRT kept every fact about a replica in environment variables: the launcher
(``torch_xla.distributed.xla_dist`` for pods, the user for one host) described
the hosts, then ``xmp.spawn`` forked one process per device and wrote that
process's ordinals before torch_xla's client started. This module reads the
same variables and returns :class:`ddp_impl.runtime.ranks.RankBindings`, validating them
the way the upstream code paths produced them. It imports neither torch nor
torch_xla, so it is safe (and tested) where XRT cannot run.

Upstream behaviour mirrored (pytorch/xla, tags v1.8.1 .. v2.0.0; XRT is gone
from v2.1.0, whose C++ runtime has only the PJRT client):

* ``torch_xla/core/xla_env_vars.py`` - the variable names.
* ``torch_xla/core/xla_model.py``: ``xrt_world_size()`` = ``XRT_SHARD_WORLD_SIZE``
  (default 1), ``get_ordinal()`` = ``XRT_SHARD_ORDINAL`` (default 0),
  ``get_local_ordinal()`` = ``XRT_SHARD_LOCAL_ORDINAL`` (default 0 outside a
  thread-per-device ``DataParallel``, whose ordinal lived in a thread-local
  device context, not the environment - not covered here).
* ``torch_xla/distributed/xla_multiprocessing.py`` (``xmp.spawn``):
  ``_pre_fork_setup`` (devices per host = ``TPU_NUM_DEVICES``, 8 when only
  ``XRT_TPU_CONFIG`` is set; ``nprocs`` must be 1 or that count; a mesh service
  address whenever more than one device takes part), ``_setup_world_size``
  (``XRT_SHARD_WORLD_SIZE`` = hosts x devices, ``XRT_HOST_WORLD_SIZE`` = hosts,
  or every device on XLA:CPU), ``_local_index_to_global`` /
  ``_get_local_worker_index`` (global ordinal = host x devices + local index,
  the host taken from ``XRT_HOST_ORDINAL`` else from ``XRT_LOCAL_WORKER``'s task
  number), ``_get_mp_device_ordinal`` (``XRT_MULTI_PROCESSING_DEVICE`` is
  ``KIND:<global ordinal>``, or ``KIND:<local index>`` when ``XRT_HOST_ORDINAL``
  is set - the sea-of-devices and XLA:CPU paths), ``_setup_tpu_worker`` (only
  the first device keeps ``XRT_TPU_CONFIG``/``TPU_NUM_DEVICES``),
  ``_setup_gpu_worker``/``_setup_cpu_worker`` and the config parsers for
  ``XRT_TPU_CONFIG`` (``name;task;host:port|...``) and ``XRT_WORKERS``
  (``name:task;[grpc://]host:port|...``).
* ``torch_xla/distributed/xla_dist.py`` (``DistributedExecutor._env_vars_cmd``):
  per pod host ``XRT_LOCAL_WORKER=c_localservice:<host>`` (``c_tpu_worker`` on
  TPU nodes), ``XRT_SHARD_WORLD_SIZE=<hosts>``, ``XRT_SHARD_ORDINAL=<host>``,
  ``TPU_NUM_DEVICES`` (8 on v2/v3), ``XRT_MESH_SERVICE_ADDRESS=<master>:8477``,
  and ``XRT_TPU_CONFIG`` (one entry per host) on the master only. Before
  ``xmp.spawn`` such a host process reads, through ``xla_model``, as one replica
  of a world of ``<hosts>``; that is what :func:`xrt_bindings` returns for it.
* ``torch_xla/distributed/xrt_init.py`` (2.0 only, ``init_xrt_context``): under
  torchrun it copies ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` into the
  ``XRT_SHARD_*`` variables, needs ``GROUP_RANK``, ``LOCAL_WORLD_SIZE`` and a
  ``MASTER_ADDR``/``MASTER_PORT`` store.
* ``third_party/xla_client/computation_client.cc`` (``ComputationClient::Create``
  and ``PopulateLocalDevices``): the client is configured by ``XRT_TPU_CONFIG``,
  or ``TPU_NUM_DEVICES``/``GPU_NUM_DEVICES``, or ``XRT_DEVICE_MAP`` together with
  ``XRT_WORKERS``, or a mesh service (``XRT_MESH_SERVICE_ADDRESS``, which needs
  ``XRT_LOCAL_WORKER``), else "Missing XLA configuration"; with
  ``XRT_MULTI_PROCESSING_DEVICE`` set the process owns exactly that device;
  ``PJRT_DEVICE`` selects PJRT instead of XRT.

JAX semantics under XRT: every distributed XRT workload is one process per
device, so ``process_index == global_ordinal``, ``process_count ==
world_size`` and ``local_device_count == 1``; ``local_ordinal`` is the index
of the device among the devices of its host.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from typing import Mapping

from ddp_impl.runtime.types import RankBindings

# Variable names (torch_xla/core/xla_env_vars.py).
TPU_CONFIG = "XRT_TPU_CONFIG"
DEVICE_MAP = "XRT_DEVICE_MAP"
WORKERS = "XRT_WORKERS"
LOCAL_WORKER = "XRT_LOCAL_WORKER"
MESH_SERVICE = "XRT_MESH_SERVICE_ADDRESS"
MP_DEVICE = "XRT_MULTI_PROCESSING_DEVICE"
SHARD_WORLD_SIZE = "XRT_SHARD_WORLD_SIZE"
SHARD_ORDINAL = "XRT_SHARD_ORDINAL"
SHARD_LOCAL_ORDINAL = "XRT_SHARD_LOCAL_ORDINAL"
HOST_WORLD_SIZE = "XRT_HOST_WORLD_SIZE"
HOST_ORDINAL = "XRT_HOST_ORDINAL"
TPU_NUM_DEVICES = "TPU_NUM_DEVICES"
GPU_NUM_DEVICES = "GPU_NUM_DEVICES"
PJRT_DEVICE = "PJRT_DEVICE"
# torchrun's variables, read by torch_xla 2.0's xrt_init.init_xrt_context().
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT")

#: ``XRT_TPU_CONFIG`` of a Cloud TPU VM whose local XRT server listens on 51011.
TPU_VM_CONFIG = "localservice;0;localhost:51011"
#: Devices per host when ``XRT_TPU_CONFIG`` is set without ``TPU_NUM_DEVICES``.
DEFAULT_TPU_DEVICES = 8
#: Newest torch_xla with the XRT runtime.
LAST_XRT_RELEASE = (2, 0)

_HOST_PORT = r"[A-Za-z0-9_\-.]+:\d+"
_TPU_CONFIG_ENTRY = re.compile(rf"(\w+);(\d+);({_HOST_PORT})")
_WORKERS_ENTRY = re.compile(rf"(\w+):(\d+);((?:grpc://)?{_HOST_PORT})")
_WORKER = re.compile(r"(\w+):(\d+)")
_DEVICE = re.compile(r"([A-Z]+):(\d+)")
_DEVICE_MAP_ENTRY = re.compile(r"([A-Z]+:\d+);(/job:\w+/replica:\d+/task:\d+/device:\w+:\d+)")
_MESH = re.compile(_HOST_PORT)


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, ``None`` when unset or empty (upstream treats both alike)."""
    value = env.get(name)
    return value if value not in (None, "") else None


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    raw = _get(env, name)
    if raw is None:
        if default is None:
            raise ValueError(f"{name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _entries(env: Mapping[str, str], name: str, pattern: re.Pattern, syntax: str) -> list[tuple]:
    raw = _get(env, name)
    if raw is None:
        return []
    out = []
    for part in raw.split("|"):
        m = pattern.fullmatch(part)
        if not m:
            raise ValueError(f"{name}={raw!r}: bad entry {part!r}, expected {syntax}")
        out.append(m.groups())
    return out


def parse_worker(env: Mapping[str, str], name: str = LOCAL_WORKER) -> tuple[str, int] | None:
    """``XRT_LOCAL_WORKER`` (``name:task``) as ``(name, task)``; ``None`` when unset."""
    raw = _get(env, name)
    if raw is None:
        return None
    m = _WORKER.fullmatch(raw)
    if not m:
        raise ValueError(f"{name}={raw!r}: expected 'worker_name:task_number'")
    return m.group(1), int(m.group(2))


def parse_tpu_config(env: Mapping[str, str]) -> list[tuple[str, int, str]]:
    """``XRT_TPU_CONFIG`` as ``[(worker_name, task, host:port), ...]`` (empty when unset)."""
    rows = _entries(env, TPU_CONFIG, _TPU_CONFIG_ENTRY, "'worker_name;task;host:port'")
    tasks = [(n, int(t)) for n, t, _ in rows]
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"{TPU_CONFIG}={env[TPU_CONFIG]!r}: a worker task appears twice")
    return [(n, int(t), a) for n, t, a in rows]


def _device(env: Mapping[str, str], name: str) -> tuple[str, int] | None:
    raw = _get(env, name)
    if raw is None:
        return None
    m = _DEVICE.fullmatch(raw)
    if not m or m.group(1) not in ("TPU", "GPU", "CPU"):
        raise ValueError(f"{name}={raw!r}: expected 'TPU:<n>', 'GPU:<n>' or 'CPU:<n>'")
    return m.group(1), int(m.group(2))


def _check_client_config(env: Mapping[str, str]) -> None:
    """Raise unless torch_xla's XRT client would find a configuration (computation_client.cc)."""
    tpu_config = parse_tpu_config(env)
    workers = _entries(env, WORKERS, _WORKERS_ENTRY, "'worker_name:task;[grpc://]host:port'")
    device_map = _entries(env, DEVICE_MAP, _DEVICE_MAP_ENTRY,
                          "'KIND:n;/job:NAME/replica:R/task:T/device:TYPE:ID'")
    if bool(workers) != bool(device_map):
        have, missing = (WORKERS, DEVICE_MAP) if workers else (DEVICE_MAP, WORKERS)
        raise ValueError(f"{missing} is not set but {have} is: the XRT client reads the two together")
    local_worker = parse_worker(env)
    mesh = _get(env, MESH_SERVICE)
    if mesh is not None and not _MESH.fullmatch(mesh):
        raise ValueError(f"{MESH_SERVICE}={mesh!r}: expected 'host:port'")
    counts = any(_int(env, v, 0) > 0 for v in (TPU_NUM_DEVICES, GPU_NUM_DEVICES))
    if not (tpu_config or device_map or counts or mesh):
        raise ValueError(
            f"no XRT configuration: none of {TPU_CONFIG}, {DEVICE_MAP}+{WORKERS}, "
            f"{TPU_NUM_DEVICES}, {GPU_NUM_DEVICES}, {MESH_SERVICE} is set "
            f"(e.g. {TPU_CONFIG}='{TPU_VM_CONFIG}' on a Cloud TPU VM)")
    if mesh and not (tpu_config or device_map or counts) and local_worker is None:
        raise ValueError(f"{LOCAL_WORKER} is not set: a mesh client ({MESH_SERVICE}={mesh!r}) "
                         "must name its worker as 'worker_name:task_number'")
    if tpu_config and local_worker is not None and _get(env, HOST_ORDINAL) is None:
        if local_worker not in [(n, t) for n, t, _ in tpu_config]:
            raise ValueError(f"{LOCAL_WORKER}={env[LOCAL_WORKER]!r} names no worker of "
                             f"{TPU_CONFIG}={env[TPU_CONFIG]!r}")
    mp = _device(env, MP_DEVICE)
    if mp is not None and device_map:
        names = [d for d, _ in device_map]
        if f"{mp[0]}:{mp[1]}" not in names:
            raise ValueError(f"{MP_DEVICE}={env[MP_DEVICE]!r} is not a device of "
                             f"{DEVICE_MAP} ({', '.join(names)})")


def _torchrun_ordinals(env: Mapping[str, str]) -> tuple[int, int, int] | None:
    """``(rank, world, local_rank)`` from torchrun's variables, as ``init_xrt_context`` reads them.

    ``None`` when ``RANK`` is unset. Raises when any variable it needs is missing
    or the node-major layout (``rank = group_rank * local_world_size + local_rank``)
    does not hold.
    """
    if _get(env, "RANK") is None:
        return None
    missing = [v for v in TORCHRUN_VARS if _get(env, v) is None]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} not set: torch_xla 2.0's xrt_init.init_xrt_context() derives "
            f"the XRT ordinals from torchrun's {', '.join(TORCHRUN_VARS)}")
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", minimum=1)
    local, group = _int(env, "LOCAL_RANK"), _int(env, "GROUP_RANK")
    lws = _int(env, "LOCAL_WORLD_SIZE", minimum=1)
    _int(env, "MASTER_PORT", minimum=1)
    if world % lws:
        raise ValueError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={lws}")
    if not local < lws or rank != group * lws + local or not rank < world:
        raise ValueError(f"RANK={rank} does not match GROUP_RANK={group} x LOCAL_WORLD_SIZE={lws} "
                         f"+ LOCAL_RANK={local} within WORLD_SIZE={world}")
    return rank, world, local


def _check_layout(env: Mapping[str, str], ordinal: int, local: int, world: int) -> None:
    """Check the replica's ordinals against the host layout ``xmp.spawn`` wrote."""
    mp = _device(env, MP_DEVICE)
    host_world = _int(env, HOST_WORLD_SIZE, 0, minimum=1) or None
    host_ordinal = _int(env, HOST_ORDINAL, -1)
    host_ordinal = None if host_ordinal < 0 else host_ordinal
    per_host = None
    if host_world is not None:
        if world % host_world:
            raise ValueError(f"{SHARD_WORLD_SIZE}={world} is not a multiple of "
                             f"{HOST_WORLD_SIZE}={host_world}")
        per_host = world // host_world
    if mp is not None:
        kind, n = mp
        expect = local if host_ordinal is not None else ordinal
        if n != expect:
            which = (f"{SHARD_LOCAL_ORDINAL}={local} ({HOST_ORDINAL} is set)" if host_ordinal is not None
                     else f"{SHARD_ORDINAL}={ordinal}")
            raise ValueError(f"{MP_DEVICE}={env[MP_DEVICE]!r} does not match {which}")
        if kind == "CPU":
            # _setup_cpu_worker: every XLA:CPU device is its own "host".
            if host_ordinal is not None and host_ordinal != ordinal:
                raise ValueError(f"{HOST_ORDINAL}={host_ordinal} must equal {SHARD_ORDINAL}={ordinal} "
                                 "on XLA:CPU (each device is its own host)")
            return
        worker = parse_worker(env)
        if kind == "GPU" and host_ordinal is None:
            if worker is not None and worker[1] != ordinal:
                raise ValueError(f"{LOCAL_WORKER}={env[LOCAL_WORKER]!r}: a GPU replica's task "
                                 f"number is its {SHARD_ORDINAL}={ordinal}")
            return
        if kind == "TPU" and host_ordinal is None:
            if worker is None:
                raise ValueError(f"{LOCAL_WORKER} is not set: xmp.spawn gives every TPU replica one")
            host, source = worker[1], f"{LOCAL_WORKER}={env[LOCAL_WORKER]!r}"
        else:
            host, source = host_ordinal, f"{HOST_ORDINAL}={host_ordinal}"
        if host_world is not None and not host < host_world:
            raise ValueError(f"{source} is outside {HOST_WORLD_SIZE}={host_world}")
        if per_host is not None:
            if not local < per_host or ordinal != host * per_host + local:
                raise ValueError(
                    f"{SHARD_ORDINAL}={ordinal} != host x devices + {SHARD_LOCAL_ORDINAL} = "
                    f"{host} x {per_host} + {local} (host from {source}, {per_host} devices per host from "
                    f"{SHARD_WORLD_SIZE}/{HOST_WORLD_SIZE})")
        elif host == 0 and ordinal != local:
            raise ValueError(f"{SHARD_ORDINAL}={ordinal} != {SHARD_LOCAL_ORDINAL}={local} "
                             f"on host 0 ({source})")
        elif host > 0 and ((ordinal - local) % host or (ordinal - local) // host <= local):
            raise ValueError(f"{SHARD_ORDINAL}={ordinal} and {SHARD_LOCAL_ORDINAL}={local} fit no "
                             f"host-major layout for host {host} ({source})")


def xrt_bindings(environ: Mapping[str, str]) -> RankBindings:
    """Rank bindings of the XRT replica whose environment is ``environ``.

    ``world_size`` = ``XRT_SHARD_WORLD_SIZE``, ``global_ordinal`` =
    ``XRT_SHARD_ORDINAL``, ``local_ordinal`` = ``XRT_SHARD_LOCAL_ORDINAL`` (each
    defaulting as ``xla_model`` did only when no replica variable is set at all:
    an unspawned process is replica 0 of 1). One process per device:
    ``process_index = global_ordinal``, ``process_count = world_size``,
    ``local_device_count = 1``. Under torchrun before ``init_xrt_context()``
    (no ``XRT_SHARD_*`` yet) the ordinals come from ``RANK``/``WORLD_SIZE``/
    ``LOCAL_RANK`` as that function will set them.

    Args:
        environ: the process environment (``os.environ`` or a recorded table row).

    Raises:
        ValueError: the environment has no XRT configuration, misses a variable
            the layout needs, or is inconsistent; the message names the variable.
    """
    env = environ
    if _get(env, PJRT_DEVICE) is not None:
        raise ValueError(f"{PJRT_DEVICE}={env[PJRT_DEVICE]!r} is set: torch_xla then runs PJRT, "
                         "not XRT; unset it to use XRT")
    replica_vars = [v for v in (SHARD_ORDINAL, SHARD_LOCAL_ORDINAL, MP_DEVICE)
                    if _get(env, v) is not None]
    torchrun = None
    if _get(env, SHARD_WORLD_SIZE) is None and not replica_vars:
        torchrun = _torchrun_ordinals(env)
    if torchrun is not None:
        ordinal, world, local = torchrun
    else:
        _check_client_config(env)
        if _get(env, SHARD_WORLD_SIZE) is None and replica_vars:
            raise ValueError(f"{SHARD_WORLD_SIZE} is not set but {', '.join(replica_vars)} is: "
                             "xmp.spawn and xla_dist always set the world size with the ordinals")
        world = _int(env, SHARD_WORLD_SIZE, 1, minimum=1)
        if _get(env, SHARD_ORDINAL) is None and (world > 1 or replica_vars):
            raise ValueError(f"{SHARD_ORDINAL} is not set (with {SHARD_WORLD_SIZE}={world}"
                             f"{', ' + ', '.join(replica_vars) if replica_vars else ''}): "
                             "every replica would claim ordinal 0")
        ordinal = _int(env, SHARD_ORDINAL, 0)
        local = _int(env, SHARD_LOCAL_ORDINAL, 0)
        if not ordinal < world:
            raise ValueError(f"{SHARD_ORDINAL}={ordinal} is outside {SHARD_WORLD_SIZE}={world}")
        if not local <= ordinal:
            raise ValueError(f"{SHARD_LOCAL_ORDINAL}={local} exceeds {SHARD_ORDINAL}={ordinal}: "
                             "global ordinals are host-major, so a local index never exceeds its ordinal")
        if world > 1 and _get(env, MESH_SERVICE) is None:
            raise ValueError(f"{MESH_SERVICE} is not set: the {world} replicas of an XRT world "
                             "meet at the mesh service (xmp.spawn/xla_dist set it)")
        tpus = _int(env, TPU_NUM_DEVICES, 0)
        if tpus and not local < tpus:
            raise ValueError(f"{SHARD_LOCAL_ORDINAL}={local} is outside {TPU_NUM_DEVICES}={tpus}")
        _check_layout(env, ordinal, local, world)
        if _get(env, "GROUP_RANK") is not None:  # torchrun + init_xrt_context: both must agree
            for xrt_name, torch_name in ((SHARD_ORDINAL, "RANK"), (SHARD_WORLD_SIZE, "WORLD_SIZE"),
                                         (SHARD_LOCAL_ORDINAL, "LOCAL_RANK")):
                if _get(env, torch_name) is not None and _get(env, xrt_name) is not None \
                        and _int(env, torch_name) != _int(env, xrt_name):
                    raise ValueError(f"{xrt_name}={env[xrt_name]} != {torch_name}={env[torch_name]}: "
                                     "init_xrt_context() copies one into the other")
    return RankBindings(process_index=ordinal, process_count=world, global_ordinal=ordinal,
                        local_ordinal=local, world_size=world, local_device_count=1)


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def xrt_detect() -> str | None:
    """``None`` when an XRT-capable torch_xla is installed, else the one-line reason.

    Reads installed package metadata only: torch_xla is never imported (its
    import starts runtime set-up - XRT server probes, TPU library loading).
    XRT-capable means torch_xla <= 2.0 next to the torch release it was built
    for (torch_xla 1.13 needs torch 1.13, 2.0 needs 2.0).
    """
    last = ".".join(map(str, LAST_XRT_RELEASE))
    xla = _dist_version("torch_xla", "torch-xla")
    if xla is None:
        return (f"torch_xla is not installed; XRT needs torch_xla <= {last} "
                f"with torch <= {last} (the same release)")
    release = _release(xla)
    if release is None:
        return f"cannot read the torch_xla version {xla!r}; XRT needs torch_xla <= {last}"
    if release > LAST_XRT_RELEASE:
        return f"XRT needs torch_xla <= {last} (found torch_xla {xla}, which has only PJRT)"
    torch = _dist_version("torch")
    want = f"{release[0]}.{release[1]}"
    if torch is None:
        return f"torch is not installed; torch_xla {xla} (XRT) needs torch {want}"
    if _release(torch) != release:
        return f"torch_xla {xla} (XRT) needs torch {want} (found torch {torch})"
    if importlib.util.find_spec("torch_xla") is None:
        return f"torch_xla {xla} is recorded as installed but its package is not importable"
    return None


__all__ = ["xrt_bindings", "xrt_detect", "parse_tpu_config", "parse_worker", "TPU_VM_CONFIG",
           "DEFAULT_TPU_DEVICES", "LAST_XRT_RELEASE"]
