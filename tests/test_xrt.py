"""XRT (legacy torch_xla <= 2.0): rank bindings from recorded environments, errors, runtime.

The tables below are the per-process environments that torch_xla's own
launchers wrote, transcribed from the upstream code that wrote them
(pytorch/xla v1.8.1..v2.0.0: ``torch_xla/distributed/xla_multiprocessing.py``
``xmp.spawn``, ``torch_xla/distributed/xla_dist.py`` for pods,
``torch_xla/distributed/xrt_init.py`` for torchrun) and from the configuration
strings its docs give (``XRT_TPU_CONFIG="localservice;0;localhost:51011"`` on a
Cloud TPU VM, ``tpu_worker;0;<ip>:8470`` on a TPU node,
``XRT_DEVICE_MAP``/``XRT_WORKERS`` for XLA:CPU). Host names, IPs and ports are
illustrative; no table was captured on live hardware (there is none here).

Every table carries the machine ("host") of each process and the exact
bindings expected as ``(process_index, process_count, global_ordinal,
local_ordinal, world_size, local_device_count)``.

Tests marked ``xrt`` all; those that need the runtime skip with the reason
``ddp_impl.runtime.xrt.xrt_detect()`` gives when XRT cannot run.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys

import numpy as np
import pytest

from conformance.worlds.runtimes import RuntimeUnavailable, get_runtime
from conformance.worlds.runtimes.xrt import XrtRuntime, host_envs_for
from ddp_impl.runtime import ranks, xrt as xrt_mod
from ddp_impl.runtime.ranks import RankBindings
from ddp_impl.runtime.xrt import TPU_VM_CONFIG, xrt_bindings, xrt_detect

pytestmark = pytest.mark.xrt

# Short names for the per-process variables.
O, L, D = "XRT_SHARD_ORDINAL", "XRT_SHARD_LOCAL_ORDINAL", "XRT_MULTI_PROCESSING_DEVICE"
W, HW, HO = "XRT_SHARD_WORLD_SIZE", "XRT_HOST_WORLD_SIZE", "XRT_HOST_ORDINAL"
TPU_CONFIG, LW, MESH = "XRT_TPU_CONFIG", "XRT_LOCAL_WORKER", "XRT_MESH_SERVICE_ADDRESS"
WORKERS, DEVMAP = "XRT_WORKERS", "XRT_DEVICE_MAP"

V3_32_TPU_CONFIG = ("c_localservice;0;10.164.0.2:51011|c_localservice;1;10.164.0.3:51011|"
                    "c_localservice;2;10.164.0.4:51011|c_localservice;3;10.164.0.5:51011")
# xla_dist._tpuvm_env_vars_cmd for a v3-32 (TPU VM mode), on every host.
_V3_32_TPUVM = {"TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPUVM_MODE": "1", "TPU_HOST_BOUNDS": "2,2,1",
                "TPU_MESH_CONTROLLER_ADDRESS": "10.164.0.2:8476", "TPU_MESH_CONTROLLER_PORT": "8476",
                "XLA_EMIT_STEPLOG": "1"}

# --- single host, xmp.spawn(nprocs=8): 8 processes x 1 TPU core ------------------
V3_8_TPU_VM = {
    "name": "v3-8 Cloud TPU VM, XRT_TPU_CONFIG=localservice;0;localhost:51011, xmp.spawn(nprocs=8)",
    "common": {W: "8", HW: "1", LW: "localservice:0", MESH: "t1v-n-5a8d2e1f-w-0:42817",
               "XRT_TORCH_DIST_ROOT": "t1v-n-5a8d2e1f-w-0:38503"},
    "hosts": {"w-0": {}},
    "rows": [
        ("w-0", {O: "0", L: "0", D: "TPU:0", TPU_CONFIG: TPU_VM_CONFIG}, (0, 8, 0, 0, 8, 1)),
        ("w-0", {O: "1", L: "1", D: "TPU:1"}, (1, 8, 1, 1, 8, 1)),
        ("w-0", {O: "2", L: "2", D: "TPU:2"}, (2, 8, 2, 2, 8, 1)),
        ("w-0", {O: "3", L: "3", D: "TPU:3"}, (3, 8, 3, 3, 8, 1)),
        ("w-0", {O: "4", L: "4", D: "TPU:4"}, (4, 8, 4, 4, 8, 1)),
        ("w-0", {O: "5", L: "5", D: "TPU:5"}, (5, 8, 5, 5, 8, 1)),
        ("w-0", {O: "6", L: "6", D: "TPU:6"}, (6, 8, 6, 6, 8, 1)),
        ("w-0", {O: "7", L: "7", D: "TPU:7"}, (7, 8, 7, 7, 8, 1)),
    ],
}

# TPU node (user VM + remote v2-8): the local worker comes from XRT_TPU_CONFIG.
V2_8_TPU_NODE = {
    "name": "v2-8 TPU node, XRT_TPU_CONFIG=tpu_worker;0;10.240.1.2:8470, xmp.spawn(nprocs=8)",
    "common": {W: "8", HW: "1", LW: "tpu_worker:0", MESH: "user-vm.c.proj.internal:36035",
               "XRT_TORCH_DIST_ROOT": "user-vm.c.proj.internal:44151"},
    "hosts": {"user-vm": {}},
    "rows": [
        ("user-vm", {O: "0", L: "0", D: "TPU:0", TPU_CONFIG: "tpu_worker;0;10.240.1.2:8470"},
         (0, 8, 0, 0, 8, 1)),
        ("user-vm", {O: "1", L: "1", D: "TPU:1"}, (1, 8, 1, 1, 8, 1)),
        ("user-vm", {O: "2", L: "2", D: "TPU:2"}, (2, 8, 2, 2, 8, 1)),
        ("user-vm", {O: "3", L: "3", D: "TPU:3"}, (3, 8, 3, 3, 8, 1)),
        ("user-vm", {O: "4", L: "4", D: "TPU:4"}, (4, 8, 4, 4, 8, 1)),
        ("user-vm", {O: "5", L: "5", D: "TPU:5"}, (5, 8, 5, 5, 8, 1)),
        ("user-vm", {O: "6", L: "6", D: "TPU:6"}, (6, 8, 6, 6, 8, 1)),
        ("user-vm", {O: "7", L: "7", D: "TPU:7"}, (7, 8, 7, 7, 8, 1)),
    ],
}

# A v2-8 reached with an explicit TPU_NUM_DEVICES and nprocs=1: one process, one core.
V2_8_ONE_PROCESS = {
    "name": "v2-8 TPU VM, xmp.spawn(nprocs=1) (world of one)",
    "common": {},
    "hosts": {"w-0": {}},
    "rows": [
        ("w-0", {W: "1", HW: "1", O: "0", L: "0", D: "TPU:0", LW: "localservice:0",
                 TPU_CONFIG: TPU_VM_CONFIG, "TPU_NUM_DEVICES": "8",
                 "XRT_TORCH_DIST_ROOT": "t1v-n-77c0e1aa-w-0:40063"}, (0, 1, 0, 0, 1, 1)),
    ],
}

# --- pod: v3-32 = 4 TPU VM hosts x 8 cores, xla_dist then xmp.spawn(nprocs=8) ----
V3_32_POD = {
    "name": "v3-32 TPU VM pod via xla_dist, xmp.spawn(nprocs=8) on each of 4 hosts",
    "common": {W: "32", HW: "4", MESH: "10.164.0.2:8477", **_V3_32_TPUVM},
    "hosts": {f"w-{h}": {LW: f"c_localservice:{h}", "CLOUD_TPU_TASK_ID": str(h)} for h in range(4)},
    "rows": [
        ("w-0", {O: "0", L: "0", D: "TPU:0", TPU_CONFIG: V3_32_TPU_CONFIG, "TPU_NUM_DEVICES": "8"}, (0, 32, 0, 0, 32, 1)),
        ("w-0", {O: "1", L: "1", D: "TPU:1"}, (1, 32, 1, 1, 32, 1)),
        ("w-0", {O: "2", L: "2", D: "TPU:2"}, (2, 32, 2, 2, 32, 1)),
        ("w-0", {O: "3", L: "3", D: "TPU:3"}, (3, 32, 3, 3, 32, 1)),
        ("w-0", {O: "4", L: "4", D: "TPU:4"}, (4, 32, 4, 4, 32, 1)),
        ("w-0", {O: "5", L: "5", D: "TPU:5"}, (5, 32, 5, 5, 32, 1)),
        ("w-0", {O: "6", L: "6", D: "TPU:6"}, (6, 32, 6, 6, 32, 1)),
        ("w-0", {O: "7", L: "7", D: "TPU:7"}, (7, 32, 7, 7, 32, 1)),
        ("w-1", {O: "8", L: "0", D: "TPU:8"}, (8, 32, 8, 0, 32, 1)),
        ("w-1", {O: "9", L: "1", D: "TPU:9"}, (9, 32, 9, 1, 32, 1)),
        ("w-1", {O: "10", L: "2", D: "TPU:10"}, (10, 32, 10, 2, 32, 1)),
        ("w-1", {O: "11", L: "3", D: "TPU:11"}, (11, 32, 11, 3, 32, 1)),
        ("w-1", {O: "12", L: "4", D: "TPU:12"}, (12, 32, 12, 4, 32, 1)),
        ("w-1", {O: "13", L: "5", D: "TPU:13"}, (13, 32, 13, 5, 32, 1)),
        ("w-1", {O: "14", L: "6", D: "TPU:14"}, (14, 32, 14, 6, 32, 1)),
        ("w-1", {O: "15", L: "7", D: "TPU:15"}, (15, 32, 15, 7, 32, 1)),
        ("w-2", {O: "16", L: "0", D: "TPU:16"}, (16, 32, 16, 0, 32, 1)),
        ("w-2", {O: "17", L: "1", D: "TPU:17"}, (17, 32, 17, 1, 32, 1)),
        ("w-2", {O: "18", L: "2", D: "TPU:18"}, (18, 32, 18, 2, 32, 1)),
        ("w-2", {O: "19", L: "3", D: "TPU:19"}, (19, 32, 19, 3, 32, 1)),
        ("w-2", {O: "20", L: "4", D: "TPU:20"}, (20, 32, 20, 4, 32, 1)),
        ("w-2", {O: "21", L: "5", D: "TPU:21"}, (21, 32, 21, 5, 32, 1)),
        ("w-2", {O: "22", L: "6", D: "TPU:22"}, (22, 32, 22, 6, 32, 1)),
        ("w-2", {O: "23", L: "7", D: "TPU:23"}, (23, 32, 23, 7, 32, 1)),
        ("w-3", {O: "24", L: "0", D: "TPU:24"}, (24, 32, 24, 0, 32, 1)),
        ("w-3", {O: "25", L: "1", D: "TPU:25"}, (25, 32, 25, 1, 32, 1)),
        ("w-3", {O: "26", L: "2", D: "TPU:26"}, (26, 32, 26, 2, 32, 1)),
        ("w-3", {O: "27", L: "3", D: "TPU:27"}, (27, 32, 27, 3, 32, 1)),
        ("w-3", {O: "28", L: "4", D: "TPU:28"}, (28, 32, 28, 4, 32, 1)),
        ("w-3", {O: "29", L: "5", D: "TPU:29"}, (29, 32, 29, 5, 32, 1)),
        ("w-3", {O: "30", L: "6", D: "TPU:30"}, (30, 32, 30, 6, 32, 1)),
        ("w-3", {O: "31", L: "7", D: "TPU:31"}, (31, 32, 31, 7, 32, 1)),
    ],
}

# The same pod's host processes as xla_dist started them, before xmp.spawn:
# xla_model reads each as one replica of a world of 4 (XRT_SHARD_* = hosts).
V3_32_HOSTS_BEFORE_SPAWN = {
    "name": "v3-32 xla_dist host processes before xmp.spawn",
    "common": {W: "4", MESH: "10.164.0.2:8477", "TPU_NUM_DEVICES": "8", **_V3_32_TPUVM},
    "hosts": {f"w-{h}": {LW: f"c_localservice:{h}", "CLOUD_TPU_TASK_ID": str(h)} for h in range(4)},
    "rows": [
        ("w-0", {O: "0", TPU_CONFIG: V3_32_TPU_CONFIG}, (0, 4, 0, 0, 4, 1)),
        ("w-1", {O: "1"}, (1, 4, 1, 0, 4, 1)),
        ("w-2", {O: "2"}, (2, 4, 2, 0, 4, 1)),
        ("w-3", {O: "3"}, (3, 4, 3, 0, 4, 1)),
    ],
}

# --- two detached v3-8 hosts ("sea of devices", XRT_HOST_ORDINAL) --------------
# Each host: XRT_TPU_CONFIG with task 0, XRT_LOCAL_WORKER=localservice:0,
# XRT_HOST_ORDINAL, XRT_SHARD_WORLD_SIZE=2 (hosts) before the fork; devices are
# numbered per host (TPU:<local>), ordinals globally; each host its own mesh.
TWO_HOST_SEA_OF_DEVICES = {
    "name": "2 x v3-8 sea of devices (XRT_HOST_ORDINAL), xmp.spawn(nprocs=8) per host",
    "common": {W: "16", HW: "2", LW: "localservice:0", "XRT_TORCH_DIST_ROOT": "host-a:12355"},
    "hosts": {"host-a": {HO: "0", MESH: "host-a:40211"}, "host-b": {HO: "1", MESH: "host-b:41877"}},
    "rows": [
        ("host-a", {O: "0", L: "0", D: "TPU:0", TPU_CONFIG: "localservice;0;localhost:51011"}, (0, 16, 0, 0, 16, 1)),
        ("host-a", {O: "1", L: "1", D: "TPU:1"}, (1, 16, 1, 1, 16, 1)),
        ("host-a", {O: "2", L: "2", D: "TPU:2"}, (2, 16, 2, 2, 16, 1)),
        ("host-a", {O: "3", L: "3", D: "TPU:3"}, (3, 16, 3, 3, 16, 1)),
        ("host-a", {O: "4", L: "4", D: "TPU:4"}, (4, 16, 4, 4, 16, 1)),
        ("host-a", {O: "5", L: "5", D: "TPU:5"}, (5, 16, 5, 5, 16, 1)),
        ("host-a", {O: "6", L: "6", D: "TPU:6"}, (6, 16, 6, 6, 16, 1)),
        ("host-a", {O: "7", L: "7", D: "TPU:7"}, (7, 16, 7, 7, 16, 1)),
        ("host-b", {O: "8", L: "0", D: "TPU:0", TPU_CONFIG: "localservice;0;localhost:51011"}, (8, 16, 8, 0, 16, 1)),
        ("host-b", {O: "9", L: "1", D: "TPU:1"}, (9, 16, 9, 1, 16, 1)),
        ("host-b", {O: "10", L: "2", D: "TPU:2"}, (10, 16, 10, 2, 16, 1)),
        ("host-b", {O: "11", L: "3", D: "TPU:3"}, (11, 16, 11, 3, 16, 1)),
        ("host-b", {O: "12", L: "4", D: "TPU:4"}, (12, 16, 12, 4, 16, 1)),
        ("host-b", {O: "13", L: "5", D: "TPU:5"}, (13, 16, 13, 5, 16, 1)),
        ("host-b", {O: "14", L: "6", D: "TPU:6"}, (14, 16, 14, 6, 16, 1)),
        ("host-b", {O: "15", L: "7", D: "TPU:7"}, (15, 16, 15, 7, 16, 1)),
    ],
}

# --- XLA:CPU through XRT: xmp.spawn(nprocs=4) with CPU_NUM_DEVICES=4 -------------
# _setup_cpu_worker: every device is its own "host" (XRT_HOST_ORDINAL = ordinal,
# XRT_HOST_WORLD_SIZE = world), own local XRT server, device CPU:<local index>.
CPU_4 = {
    "name": "XLA:CPU, CPU_NUM_DEVICES=4, xmp.spawn(nprocs=4)",
    "common": {W: "4", HW: "4", LW: "localservice:0", MESH: "devbox:39971",
               "XRT_TORCH_DIST_ROOT": "devbox:45519"},
    "hosts": {"devbox": {}},
    "rows": [
        ("devbox", {O: str(i), L: str(i), D: f"CPU:{i}", HO: str(i),
                    WORKERS: f"localservice:0;grpc://localhost:{40931 + i}",
                    DEVMAP: f"CPU:{i};/job:localservice/replica:0/task:0/device:XLA_CPU:0"},
         (i, 4, i, i, 4, 1))
        for i in range(4)
    ],
}

# --- XLA:GPU through XRT: xmp.spawn(nprocs=4) with GPU_NUM_DEVICES=4 ------------
_GPU_WORKERS = "|".join(f"localservice:{g};grpc://gpu-box:{47001 + g}" for g in range(4))
_GPU_DEVMAP = "|".join(f"GPU:{g};/job:localservice/replica:0/task:{g}/device:XLA_GPU:0" for g in range(4))
GPU_4 = {
    "name": "XLA:GPU, GPU_NUM_DEVICES=4, xmp.spawn(nprocs=4)",
    "common": {W: "4", HW: "1", MESH: "gpu-box:46211", WORKERS: _GPU_WORKERS, DEVMAP: _GPU_DEVMAP,
               "XRT_TORCH_DIST_ROOT": "gpu-box:33391"},
    "hosts": {"gpu-box": {}},
    "rows": [
        ("gpu-box", {O: str(g), L: str(g), D: f"GPU:{g}", LW: f"localservice:{g}",
                     "CUDA_VISIBLE_DEVICES": str(g)}, (g, 4, g, g, 4, 1))
        for g in range(4)
    ],
}

# --- torchrun --nnodes=2 --nproc_per_node=2 with torch_xla 2.0 xrt_init ---------
_TORCHRUN = [  # (node, RANK, LOCAL_RANK, GROUP_RANK)
    ("node-0", 0, 0, 0), ("node-0", 1, 1, 0), ("node-1", 2, 0, 1), ("node-1", 3, 1, 1)]
_TR_COMMON = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node-0", "MASTER_PORT": "29500"}
_TR_WORKERS = ("localservice:0;grpc://node-0:51200|localservice:1;grpc://node-0:51201|"
               "localservice:2;grpc://node-1:51200|localservice:3;grpc://node-1:51201")
_TR_DEVMAP = "|".join(f"GPU:{g};/job:localservice/replica:0/task:{g}/device:XLA_GPU:0" for g in range(4))
TORCHRUN_BEFORE_INIT = {
    "name": "torchrun 2 nodes x 2 GPUs, before xrt_init.init_xrt_context()",
    "common": dict(_TR_COMMON),
    "hosts": {"node-0": {}, "node-1": {}},
    "rows": [(n, {"RANK": str(r), "LOCAL_RANK": str(lr), "GROUP_RANK": str(gr), "ROLE_RANK": str(r)},
              (r, 4, r, lr, 4, 1)) for n, r, lr, gr in _TORCHRUN],
}
TORCHRUN_AFTER_INIT = {
    "name": "torchrun 2 nodes x 2 GPUs, after xrt_init.init_xrt_context()",
    "common": {**_TR_COMMON, W: "4", MESH: "node-0:52011", WORKERS: _TR_WORKERS, DEVMAP: _TR_DEVMAP,
               "TPU_MESH_CONTROLLER_ADDRESS": "node-0:52013", "TPU_MESH_CONTROLLER_PORT": "52013"},
    "hosts": {"node-0": {}, "node-1": {}},
    "rows": [(n, {"RANK": str(r), "LOCAL_RANK": str(lr), "GROUP_RANK": str(gr), O: str(r), L: str(lr),
                  LW: f"localservice:{r}", D: f"GPU:{r}", "CUDA_VISIBLE_DEVICES": str(lr)},
              (r, 4, r, lr, 4, 1)) for n, r, lr, gr in _TORCHRUN],
}

# --- one process, not spawned: xla_model reports a world of one ------------------
UNSPAWNED = {
    "name": "unspawned single processes (XRT_TPU_CONFIG / XRT_DEVICE_MAP+XRT_WORKERS / GPU_NUM_DEVICES)",
    "common": {},
    "hosts": {"tpu-vm": {}, "devbox": {}, "gpu-box": {}},
    "rows": [
        ("tpu-vm", {TPU_CONFIG: TPU_VM_CONFIG}, (0, 1, 0, 0, 1, 1)),
        ("devbox", {DEVMAP: "CPU:0;/job:localservice/replica:0/task:0/device:XLA_CPU:0",
                    WORKERS: "localservice:0;grpc://localhost:40934"}, (0, 1, 0, 0, 1, 1)),
        ("gpu-box", {"GPU_NUM_DEVICES": "1"}, (0, 1, 0, 0, 1, 1)),
    ],
    "one_world": False,  # three independent worlds of one, not one world
}

TABLES = [V3_8_TPU_VM, V2_8_TPU_NODE, V2_8_ONE_PROCESS, V3_32_POD, V3_32_HOSTS_BEFORE_SPAWN,
          TWO_HOST_SEA_OF_DEVICES, CPU_4, GPU_4, TORCHRUN_BEFORE_INIT, TORCHRUN_AFTER_INIT, UNSPAWNED]
FIELDS = ("process_index", "process_count", "global_ordinal", "local_ordinal", "world_size",
          "local_device_count")


def _rows(table):
    """``[(host, env, expected), ...]``: common, then host, then process variables."""
    return [(host, {**table["common"], **table["hosts"][host], **env}, expected)
            for host, env, expected in table["rows"]]


def _as_tuple(b):
    return tuple(getattr(b, f) for f in FIELDS)


def assert_world_invariants(bindings_by_host):
    """What every runtime's bindings must satisfy over one world's processes.

    ``bindings_by_host``: ``[(host, RankBindings), ...]``, one entry per process.
    """
    bs = [b for _, b in bindings_by_host]
    assert len({b.world_size for b in bs}) == 1, "processes disagree on world_size"
    assert len({b.process_count for b in bs}) == 1, "processes disagree on process_count"
    world, processes = bs[0].world_size, bs[0].process_count
    assert len(bs) == processes, f"{len(bs)} processes in the table, process_count says {processes}"
    assert sorted(b.process_index for b in bs) == list(range(processes)), "process indices not 0..P-1"
    assert sum(b.local_device_count for b in bs) == world, "world_size != sum of local device counts"
    assert sorted(b.global_ordinal for b in bs) == list(range(world)), "ordinals not unique 0..W-1"
    for host in {h for h, _ in bindings_by_host}:
        local = sorted(b.local_ordinal for h, b in bindings_by_host if h == host)
        assert len(local) == len(set(local)), f"local ordinals repeat on {host}: {local}"
        assert local == list(range(len(local))), f"local ordinals on {host} not 0..k-1: {local}"
    for b in bs:  # XRT: one process per device
        assert b.local_device_count == 1
        assert b.process_index == b.global_ordinal


# ---------------------------------------------------------------------------
# (a) recorded tables
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("table", TABLES, ids=[t["name"] for t in TABLES])
def test_recorded_table_exact_bindings(table):
    for host, env, expected in _rows(table):
        got = _as_tuple(xrt_bindings(env))
        assert got == expected, f"{table['name']}: {host} {env} -> {dict(zip(FIELDS, got))}"


@pytest.mark.parametrize("table", [t for t in TABLES if t.get("one_world", True)],
                         ids=[t["name"] for t in TABLES if t.get("one_world", True)])
def test_recorded_table_world_invariants(table):
    assert_world_invariants([(host, xrt_bindings(env)) for host, env, _ in _rows(table)])


def test_recorded_tables_shapes():
    """The tables are the layouts they claim (guards the data itself)."""
    def shape(t):
        hosts = [h for h, _, _ in t["rows"]]
        return [hosts.count(h) for h in t["hosts"]]
    assert shape(V3_8_TPU_VM) == shape(V2_8_TPU_NODE) == [8]
    assert shape(V3_32_POD) == [8, 8, 8, 8]
    assert shape(TWO_HOST_SEA_OF_DEVICES) == [8, 8]
    assert shape(V3_32_HOSTS_BEFORE_SPAWN) == [1, 1, 1, 1]
    # only the mesh master (or each host's first device in a sea of devices) keeps the TPU config
    assert [e[O] for _, e, _ in _rows(V3_32_POD) if TPU_CONFIG in e] == ["0"]
    assert [e[O] for _, e, _ in _rows(TWO_HOST_SEA_OF_DEVICES) if TPU_CONFIG in e] == ["0", "8"]


@pytest.mark.parametrize("table", TABLES, ids=[t["name"] for t in TABLES])
def test_spawned_replicas_are_routed_to_xrt_bindings(table):
    """``ddp_impl.runtime.ranks`` names the runtime ``xrt`` for every process with XRT ordinals."""
    for _, env, _ in _rows(table):
        if W in env:
            assert ranks.current_runtime(env) == "xrt", env


def test_bindings_read_a_mapping_not_os_environ(monkeypatch):
    monkeypatch.setenv(O, "5")
    monkeypatch.setenv(W, "8")
    env = _rows(V3_8_TPU_VM)[2][1]
    assert xrt_bindings(env).global_ordinal == 2


# --- the adapter's per-process environments (runs here: no torch_xla needed) ---
@pytest.mark.parametrize("launcher_env", [{TPU_CONFIG: TPU_VM_CONFIG}, {}],
                         ids=["XRT_TPU_CONFIG set", "Cloud TPU VM default"])
def test_host_envs_are_the_v3_8_layout(launcher_env):
    envs = host_envs_for(8, launcher_env)
    got = [xrt_bindings(e) for e in envs]
    assert [_as_tuple(b) for b in got] == [exp for _, _, exp in V3_8_TPU_VM["rows"]]
    assert_world_invariants([("w-0", b) for b in got])
    assert [TPU_CONFIG in e for e in envs] == [True] + [False] * 7
    assert [e[D] for e in envs] == [f"TPU:{i}" for i in range(8)]
    assert len({e[MESH] for e in envs}) == 1 and re.fullmatch(r"localhost:\d+", envs[0][MESH])
    assert all(e[LW] == "localservice:0" and e[HW] == "1" for e in envs)


def test_host_envs_world_of_one_has_no_mesh():
    (env,) = host_envs_for(1, {TPU_CONFIG: TPU_VM_CONFIG})
    assert MESH not in env
    assert _as_tuple(xrt_bindings(env)) == (0, 1, 0, 0, 1, 1)


def test_host_envs_tpu_node_and_device_count():
    envs = host_envs_for(4, {TPU_CONFIG: "tpu_worker;0;10.240.1.2:8470", "TPU_NUM_DEVICES": "4",
                             MESH: "user-vm:8477"})
    assert [e[LW] for e in envs] == ["tpu_worker:0"] * 4
    assert [e.get("TPU_NUM_DEVICES") for e in envs] == ["4", None, None, None]
    assert {e[MESH] for e in envs} == {"user-vm:8477"}
    assert_world_invariants([("user-vm", xrt_bindings(e)) for e in envs])


@pytest.mark.parametrize("world_size, launcher_env, words", [
    (4, {TPU_CONFIG: TPU_VM_CONFIG}, "1 or 8"),
    (2, {TPU_CONFIG: TPU_VM_CONFIG}, "1 or 8"),
    (8, {TPU_CONFIG: V3_32_TPU_CONFIG}, "not one host"),
    (8, {TPU_CONFIG: "localservice;3;localhost:51011"}, "task 0"),
    (8, {TPU_CONFIG: "localservice:0:localhost:51011"}, TPU_CONFIG),
    (8, {TPU_CONFIG: TPU_VM_CONFIG, "TPU_NUM_DEVICES": "eight"}, "TPU_NUM_DEVICES"),
])
def test_host_envs_reject_layouts_xrt_cannot_run(world_size, launcher_env, words):
    with pytest.raises(RuntimeUnavailable, match=re.escape(words)):
        host_envs_for(world_size, launcher_env)


# ---------------------------------------------------------------------------
# (b) missing / inconsistent environments -> ValueError naming the variable
# ---------------------------------------------------------------------------
def _v3_8(i, **changes):
    env = dict(_rows(V3_8_TPU_VM)[i][1])
    for k, v in changes.items():
        k = {"O": O, "L": L, "D": D, "W": W, "HW": HW, "HO": HO, "LW": LW, "MESH": MESH,
             "TPU_CONFIG": TPU_CONFIG}.get(k, k)
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _pod(i, **changes):
    env = dict(_rows(V3_32_POD)[i][1])
    env.update(changes)
    return env


ERRORS = [
    ("empty environment", {}, "XRT_TPU_CONFIG"),
    ("PJRT_DEVICE selects PJRT", {TPU_CONFIG: TPU_VM_CONFIG, "PJRT_DEVICE": "TPU"}, "PJRT_DEVICE"),
    ("ordinal without world size", _v3_8(3, W=None), W),
    ("local ordinal without world size", {TPU_CONFIG: TPU_VM_CONFIG, L: "0"}, W),
    ("world size > 1 without ordinal", _v3_8(3, O=None, L=None, D=None), O),
    ("device without ordinal", _v3_8(3, O=None), O),
    ("ordinal outside world", _v3_8(7, O="8", L="0", D="TPU:8"), O),
    ("ordinal not an integer", _v3_8(2, O="two"), O),
    ("negative ordinal", _v3_8(2, O="-1"), O),
    ("world size zero", _v3_8(0, W="0"), W),
    ("local ordinal above ordinal", {TPU_CONFIG: TPU_VM_CONFIG, W: "8", O: "2", L: "5", MESH: "w-0:8477"},
     f"{L}=5 exceeds"),
    ("local ordinal above ordinal (spawned)", _v3_8(2, L="5"), L),
    ("host 0 ordinal is its local index (no host world size)", _v3_8(3, HW=None, D="TPU:3", O="3", L="2"),
     "on host 0"),
    ("host-major layout without host world size",
     {k: v for k, v in _pod(9, **{LW: "c_localservice:3"}).items() if k != HW}, "fit no host-major layout"),
    ("no mesh service for a world > 1", _v3_8(0, MESH=None), MESH),
    ("bad mesh address", _v3_8(2, MESH="t1v-n-5a8d2e1f-w-0"), MESH),
    ("device does not match ordinal", _v3_8(2, D="TPU:3"), D),
    ("device kind unknown", _v3_8(2, D="XPU:2"), D),
    ("device without index", _v3_8(2, D="TPU"), D),
    ("TPU replica without local worker", _v3_8(2, LW=None), LW),
    ("local worker syntax", _v3_8(2, LW="localservice;0"), LW),
    ("local worker not in the TPU config", _v3_8(0, LW="c_localservice:0"), LW),
    ("bad TPU config", {TPU_CONFIG: "localservice:0:localhost:51011"}, TPU_CONFIG),
    ("TPU config repeats a task", {TPU_CONFIG: TPU_VM_CONFIG + "|" + TPU_VM_CONFIG}, TPU_CONFIG),
    ("device map without workers", {DEVMAP: "CPU:0;/job:localservice/replica:0/task:0/device:XLA_CPU:0"},
     WORKERS),
    ("workers without device map", {WORKERS: "localservice:0;grpc://localhost:40934"}, DEVMAP),
    ("bad workers entry", {WORKERS: "localservice:0@localhost:40934",
                           DEVMAP: "CPU:0;/job:localservice/replica:0/task:0/device:XLA_CPU:0"}, WORKERS),
    ("bad device map entry", {WORKERS: "localservice:0;grpc://localhost:40934", DEVMAP: "CPU:0"}, DEVMAP),
    ("device not in device map", {**_rows(GPU_4)[1][1], D: "GPU:1", DEVMAP: _GPU_DEVMAP.split("|")[0]}, D),
    ("mesh client without local worker", {MESH: "10.164.0.2:8477"}, LW),
    ("TPU_NUM_DEVICES not an integer", {TPU_CONFIG: TPU_VM_CONFIG, "TPU_NUM_DEVICES": "eight"},
     "TPU_NUM_DEVICES"),
    ("local ordinal beyond TPU_NUM_DEVICES",
     {**_rows(V2_8_ONE_PROCESS)[0][1], W: "16", O: "9", L: "9", D: "TPU:9", MESH: "w-0:8477"},
     "TPU_NUM_DEVICES"),
    ("pod replica on the wrong host", _pod(9, **{LW: "c_localservice:2"}), LW),
    ("pod ordinal off the host-major layout", _pod(9, **{O: "10", D: "TPU:10"}), O),
    ("pod host world does not divide world", _pod(9, **{HW: "3"}), HW),
    ("pod host outside host world", _pod(9, **{HW: "2", W: "16", LW: "c_localservice:3"}),
     "XRT_LOCAL_WORKER='c_localservice:3' is outside XRT_HOST_WORLD_SIZE=2"),
    ("sea of devices: device must be the local index",
     {**_rows(TWO_HOST_SEA_OF_DEVICES)[9][1], D: "TPU:9"}, D),
    ("sea of devices: host ordinal outside host world",
     {**_rows(TWO_HOST_SEA_OF_DEVICES)[9][1], HO: "2"}, "XRT_HOST_ORDINAL=2 is outside XRT_HOST_WORLD_SIZE=2"),
    ("XLA:CPU host ordinal is the ordinal", {**_rows(CPU_4)[2][1], HO: "0"}, HO),
    ("GPU worker task is the ordinal", {**_rows(GPU_4)[2][1], LW: "localservice:0"}, LW),
    ("torchrun without GROUP_RANK", {k: v for k, v in _rows(TORCHRUN_BEFORE_INIT)[1][1].items()
                                     if k != "GROUP_RANK"}, "GROUP_RANK"),
    ("torchrun without MASTER_PORT", {k: v for k, v in _rows(TORCHRUN_BEFORE_INIT)[1][1].items()
                                      if k != "MASTER_PORT"}, "MASTER_PORT"),
    ("torchrun rank off node-major layout", {**_rows(TORCHRUN_BEFORE_INIT)[1][1], "RANK": "2"}, "RANK"),
    ("torchrun world not a multiple of nodes", {**_rows(TORCHRUN_BEFORE_INIT)[1][1], "WORLD_SIZE": "3"},
     "LOCAL_WORLD_SIZE"),
    ("torchrun RANK not an integer after init", {**_rows(TORCHRUN_AFTER_INIT)[2][1], "RANK": "two"}, "RANK"),
    ("xrt_init copy disagrees with torchrun",
     {**_rows(TORCHRUN_AFTER_INIT)[2][1], "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1"}, O),
]


@pytest.mark.parametrize("name, env, var", ERRORS, ids=[n for n, _, _ in ERRORS])
def test_inconsistent_environment_names_the_variable(name, env, var):
    with pytest.raises(ValueError, match=re.escape(var)) as info:
        xrt_bindings(env)
    assert "\n" not in str(info.value)
    # the catch-all "no configuration" message names many variables: only the
    # empty environment may end there, every other case must hit its own check
    assert (str(info.value).startswith("no XRT configuration")) == (name == "empty environment")


# ---------------------------------------------------------------------------
# xrt_detect: metadata only, precise reasons
# ---------------------------------------------------------------------------
def _fake_metadata(monkeypatch, versions, importable=True):
    def version(name):
        key = name.replace("-", "_")
        if key not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[key]
    monkeypatch.setattr(xrt_mod.importlib.metadata, "version", version)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(xrt_mod.importlib.util, "find_spec",
                        lambda name, *a: (object() if importable else None) if name == "torch_xla"
                        else real_find_spec(name, *a))


@pytest.mark.parametrize("versions, importable, expected", [
    ({"torch": "2.13.0+cpu"}, True,
     "torch_xla is not installed; XRT needs torch_xla <= 2.0 with torch <= 2.0 (the same release)"),
    ({"torch": "2.9.0", "torch_xla": "2.9.0"}, True,
     "XRT needs torch_xla <= 2.0 (found torch_xla 2.9.0, which has only PJRT)"),
    ({"torch": "2.1.0", "torch_xla": "2.1.0+libtpu"}, True,
     "XRT needs torch_xla <= 2.0 (found torch_xla 2.1.0+libtpu, which has only PJRT)"),
    ({"torch": "2.13.0", "torch_xla": "2.0"}, True, "torch_xla 2.0 (XRT) needs torch 2.0 (found torch 2.13.0)"),
    ({"torch_xla": "1.13"}, True, "torch is not installed; torch_xla 1.13 (XRT) needs torch 1.13"),
    ({"torch": "2.0.0", "torch_xla": "nightly"}, True,
     "cannot read the torch_xla version 'nightly'; XRT needs torch_xla <= 2.0"),
    ({"torch": "2.0.0", "torch_xla": "2.0"}, False,
     "torch_xla 2.0 is recorded as installed but its package is not importable"),
    ({"torch": "2.0.1", "torch_xla": "2.0"}, True, None),
    ({"torch": "1.13.1", "torch_xla": "1.13"}, True, None),
    ({"torch": "1.8.1", "torch_xla": "1.8.1"}, True, None),
])
def test_xrt_detect_reasons(monkeypatch, versions, importable, expected):
    _fake_metadata(monkeypatch, versions, importable)
    before = "torch_xla" in sys.modules
    assert xrt_detect() == expected
    assert ("torch_xla" in sys.modules) == before, "xrt_detect must not import torch_xla"


def test_xrt_detect_here_is_one_line():
    reason = xrt_detect()
    assert reason is None or (reason and "\n" not in reason)


# ---------------------------------------------------------------------------
# (c) the runtime: skips here with xrt_detect's reason
# ---------------------------------------------------------------------------
def _require_xrt(world_size):
    """Skip with the precise reason unless an XRT world of ``world_size`` can start here."""
    try:
        get_runtime("xrt").check(world_size)
    except RuntimeUnavailable as exc:
        pytest.skip(str(exc))


def test_unavailable_runtime_raises_the_detect_reason():
    """Where XRT cannot run, World("xrt", 8) refuses with exactly xrt_detect's reason."""
    from conformance.worlds.spawned import World
    reason = xrt_detect()
    if reason is None:
        pytest.skip("XRT-capable torch_xla installed: the unavailable path does not apply")
    assert isinstance(get_runtime("xrt"), XrtRuntime)
    with pytest.raises(RuntimeUnavailable) as info:
        get_runtime("xrt").check(8)
    assert str(info.value) == reason
    with pytest.raises(RuntimeUnavailable) as info:
        World("xrt", 8)
    assert str(info.value) == reason


@pytest.mark.parametrize("world_size", [1, 8])
def test_xrt_world_bindings_on_runtime(world_size):
    """Each replica of a live XRT world reports the bindings its host_envs promised."""
    _require_xrt(world_size)
    from conformance.cases.invariant.kind import rank_report
    from conformance.worlds.spawned import World
    with World("xrt", world_size) as world:
        reports = world.run(rank_report)
    got = [("tpu-host", RankBindings(**r["bindings"])) for r in reports]
    assert_world_invariants(got)
    for ordinal, r in enumerate(reports):
        assert r["ctx_rank"] == ordinal and r["ctx_world_size"] == world_size
        assert r["bindings"] == r["module_api"]



# --- parity smoke: K SGD steps of a linear model, gradients averaged by the runtime ---
SMOKE_STEPS, SMOKE_LR, SMOKE_PER_REPLICA = 3, 0.1, 4
# TPU f32 matmuls default to reduced (bf16-pass) precision: a smoke-level bound.
SMOKE_ATOL = 2e-2


def _smoke_data(world_size):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((world_size * SMOKE_PER_REPLICA, 4)).astype(np.float32)
    shard = np.repeat(np.arange(world_size, dtype=np.float32), SMOKE_PER_REPLICA)[:, None]
    y = (x @ np.array([[0.5], [-1.0], [0.25], [2.0]], np.float32) + shard).astype(np.float32)
    w0 = rng.standard_normal((1, 4)).astype(np.float32)
    b0 = np.zeros((1,), np.float32)
    return x, y, w0, b0


def _train_cpu(x, y, w0, b0, steps=SMOKE_STEPS):
    """The oracle: plain full-batch SGD on one CPU device, float32."""
    import torch
    w, b = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    for _ in range(steps):
        loss = torch.mean((torch.tensor(x) @ w.T + b - torch.tensor(y)) ** 2)
        gw, gb = torch.autograd.grad(loss, [w, b])
        with torch.no_grad():
            w -= SMOKE_LR * gw
            b -= SMOKE_LR * gb
    return w.detach().numpy(), b.detach().numpy()


def smoke_replica_task(ctx, x, y, w0, b0, steps):
    """One replica: SGD on its shard; gradients mean-all-reduced by ``ctx.collectives``."""
    import torch
    lo, hi = ctx.rank * SMOKE_PER_REPLICA, (ctx.rank + 1) * SMOKE_PER_REPLICA
    xs, ys = torch.tensor(x[lo:hi]).to(ctx.device), torch.tensor(y[lo:hi]).to(ctx.device)
    w = torch.tensor(w0).to(ctx.device).requires_grad_()
    b = torch.tensor(b0).to(ctx.device).requires_grad_()
    for _ in range(steps):
        loss = torch.mean((xs @ w.T + b - ys) ** 2)
        gw, gb = torch.autograd.grad(loss, [w, b])
        ctx.collectives.all_reduce_(gw, scale=1.0 / ctx.world_size)
        ctx.collectives.all_reduce_(gb, scale=1.0 / ctx.world_size)
        with torch.no_grad():
            w -= SMOKE_LR * gw
            b -= SMOKE_LR * gb
        ctx.mark_step()
    return w.detach().cpu().numpy(), b.detach().cpu().numpy()


def test_parity_smoke_data_is_not_vacuous():
    """Without the all-reduce a replica would end far outside the smoke tolerance."""
    x, y, w0, b0 = _smoke_data(8)
    ow, ob = _train_cpu(x, y, w0, b0)
    for rank in (0, 7):
        lo, hi = rank * SMOKE_PER_REPLICA, (rank + 1) * SMOKE_PER_REPLICA
        lw, lb = _train_cpu(x[lo:hi], y[lo:hi], w0, b0)
        margin = max(np.abs(lw - ow).max(), np.abs(lb - ob).max())
        assert margin > 10 * SMOKE_ATOL, (rank, margin)


def test_xrt_parity_smoke():
    """World("xrt", 8): every replica ends at the single-device oracle's parameters."""
    _require_xrt(8)
    from conformance.worlds.spawned import World
    x, y, w0, b0 = _smoke_data(8)
    ow, ob = _train_cpu(x, y, w0, b0)
    with World("xrt", 8, timeout=600) as world:
        results = world.run(smoke_replica_task, x=x, y=y, w0=w0, b0=b0, steps=SMOKE_STEPS)
    for rank, (w, b) in enumerate(results):
        dev = max(np.abs(w - ow).max(), np.abs(b - ob).max())
        assert dev <= SMOKE_ATOL, f"replica {rank}: max deviation {dev:.3g} > atol {SMOKE_ATOL}"
