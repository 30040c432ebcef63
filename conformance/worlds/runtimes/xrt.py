"""XRT runtime (legacy torch_xla <= 2.0): one process per TPU core of a v2-8/v3-8 host.

XRT ran every distributed workload as one process per device: on a v2-8 or v3-8 host
``xmp.spawn`` started 8 processes, each owning one TPU core (``XRT_MULTI_PROCESSING_DEVICE=TPU:<i>``)
and told its ordinals through the ``XRT_SHARD_*`` variables; the processes met at a mesh service
whose address is ``XRT_MESH_SERVICE_ADDRESS``. :meth:`XrtRuntime.host_envs` writes exactly the
per-process environments ``xmp.spawn`` wrote for one host (see :mod:`ddp_impl.runtime.xrt` for
the upstream code mirrored), so a :class:`World` of ``xrt`` replicas is 8 host processes x 1
replica (or 1 x 1).

Can it run here? Only with an XRT-capable torch_xla (<= 2.0, next to the torch of the same
release) and a TPU (``XRT_TPU_CONFIG`` set, or a Cloud TPU VM's ``/dev/accel0``). No such wheel
exists for this machine's Python, so :meth:`XrtRuntime.check` raises :class:`RuntimeUnavailable`
with the reason from :func:`ddp_impl.runtime.xrt.xrt_detect`; :meth:`setup_host`,
:meth:`teardown_host` and :class:`XrtCollectives` are written against the torch_xla 2.0 API and
have never been executed on XRT by this kit. The environment layout (:meth:`host_envs`) is
unit-tested against recorded tables.
"""
from __future__ import annotations

import os
import socket

from conformance.worlds.runtimes.base import ReplicaContext, Runtime, RuntimeUnavailable

# /dev/accel0 exists on Cloud TPU VMs (one node per chip).
TPU_DEVICE_NODE = "/dev/accel0"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def host_envs_for(world_size: int, environ) -> list[dict]:
    """Per-process environments of one v2-8/v3-8 host running ``world_size`` XRT replicas.

    Mirrors ``xmp.spawn(fn, nprocs=world_size)`` on one host (torch_xla <= 2.0, ``_pre_fork_setup``
    + ``_prepare_env_for_index`` + ``_setup_tpu_worker``): ``XRT_SHARD_WORLD_SIZE=W``,
    ``XRT_HOST_WORLD_SIZE=1``, ``XRT_SHARD_ORDINAL=XRT_SHARD_LOCAL_ORDINAL=i``,
    ``XRT_MULTI_PROCESSING_DEVICE=TPU:i``, ``XRT_LOCAL_WORKER`` from the single ``XRT_TPU_CONFIG``
    worker, a mesh service address when ``W > 1``; only process 0 keeps ``XRT_TPU_CONFIG`` (and
    ``TPU_NUM_DEVICES`` when given), the others are mesh clients.

    Args:
        world_size: 1 or the host's device count (``TPU_NUM_DEVICES``, default 8).
        environ: the launcher's environment (``XRT_TPU_CONFIG``, ``TPU_NUM_DEVICES``,
            ``XRT_MESH_SERVICE_ADDRESS`` are read; a Cloud TPU VM's
            ``localservice;0;localhost:51011`` when ``XRT_TPU_CONFIG`` is unset).

    Raises:
        RuntimeUnavailable: the configuration is not one host, or ``world_size`` is neither 1
            nor the device count.
    """
    from ddp_impl.runtime import xrt as _x  # ddp_impl loads torch: the runtime's facts do not need it
    config = environ.get(_x.TPU_CONFIG) or _x.TPU_VM_CONFIG
    try:
        workers = _x.parse_tpu_config({_x.TPU_CONFIG: config})
        devices = _x._int(environ, _x.TPU_NUM_DEVICES, _x.DEFAULT_TPU_DEVICES, minimum=1)
    except ValueError as exc:
        raise RuntimeUnavailable(str(exc)) from None
    if len(workers) != 1 or workers[0][1] != 0:
        raise RuntimeUnavailable(
            f"{_x.TPU_CONFIG}={config!r} is not one host with task 0; the xrt adapter runs one "
            "v2-8/v3-8 host (pods need torch_xla.distributed.xla_dist)")
    if world_size not in (1, devices):
        raise RuntimeUnavailable(
            f"XRT runs 1 or {devices} replicas on this host (xmp.spawn's nprocs must be 1 or "
            f"{_x.TPU_NUM_DEVICES}={devices}); world size {world_size} asked")
    name, task, _ = workers[0]
    common = {_x.SHARD_WORLD_SIZE: str(world_size), _x.HOST_WORLD_SIZE: "1",
              _x.LOCAL_WORKER: f"{name}:{task}"}
    if world_size > 1:
        common[_x.MESH_SERVICE] = environ.get(_x.MESH_SERVICE) or f"localhost:{_free_port()}"
    envs = []
    for i in range(world_size):
        env = common | {_x.SHARD_ORDINAL: str(i), _x.SHARD_LOCAL_ORDINAL: str(i), _x.MP_DEVICE: f"TPU:{i}"}
        if i == 0:  # the mesh master keeps the TPU configuration
            env[_x.TPU_CONFIG] = config
            if environ.get(_x.TPU_NUM_DEVICES):
                env[_x.TPU_NUM_DEVICES] = environ[_x.TPU_NUM_DEVICES]
        envs.append(env)
    return envs


class XrtCollectives:
    """:class:`ddp_impl.runtime.collectives.Collectives` over ``torch_xla.core.xla_model`` (XRT).

    ``all_reduce_`` is ``xm.all_reduce(REDUCE_SUM, [t], scale=...)`` (in place for a list);
    ``broadcast_`` zeroes every replica but ``src`` and sums (torch_xla 2.0 has no broadcast
    collective); ``all_gather`` stacks with ``xm.all_gather``; ``barrier`` is ``xm.rendezvous``.
    """

    def __init__(self, rank: int, world_size: int):
        import torch_xla.core.xla_model as xm
        self._xm, self.rank, self.world_size = xm, rank, world_size

    def all_reduce_(self, tensor, *, scale=1.0):
        if self.world_size > 1:
            self._xm.all_reduce(self._xm.REDUCE_SUM, [tensor], scale=scale)
        elif scale != 1.0:
            tensor.mul_(scale)
        return tensor

    def broadcast_(self, tensor, src=0):
        if self.world_size > 1:
            if self.rank != src:
                tensor.zero_()
            self._xm.all_reduce(self._xm.REDUCE_SUM, [tensor])
        return tensor

    def all_gather(self, tensor):
        if self.world_size == 1:
            return [tensor.clone()]
        stacked = self._xm.all_gather(tensor.unsqueeze(0), dim=0)
        return [t.clone() for t in stacked.unbind(0)]

    def barrier(self):
        if self.world_size > 1:
            self._xm.rendezvous("ddp-conformance-barrier")


class XrtRuntime(Runtime):
    """Adapter for XRT on one TPU v2-8/v3-8 host: W in {1, 8} processes x 1 TPU core (where it
    runs, and what of it was never run: the module docstring)."""

    name = "xrt"
    # ddp_impl.runtime.xrt.DEFAULT_TPU_DEVICES (tests/test_cli.py compares), written out so that
    # reading the runtime's facts does not load torch (ddp_impl does).
    max_world_size = 8
    default_world_sizes = (8,)  # a whole v2-8/v3-8 host
    default_impls = ("ref",)
    compiled_graphs = True  # TPU: every distinct graph is compiled

    def check(self, world_size):
        from ddp_impl.runtime import xrt as _x  # loads torch (see max_world_size)
        reason = _x.xrt_detect()
        if reason:
            raise RuntimeUnavailable(reason)
        super().check(world_size)
        if not os.environ.get(_x.TPU_CONFIG) and not os.path.exists(TPU_DEVICE_NODE):
            raise RuntimeUnavailable(
                f"no TPU: {_x.TPU_CONFIG} is unset and {TPU_DEVICE_NODE} does not exist "
                f"(set {_x.TPU_CONFIG}, e.g. '{_x.TPU_VM_CONFIG}' on a Cloud TPU VM)")
        host_envs_for(world_size, os.environ)  # raises on a layout XRT cannot run

    def host_envs(self, world_size):
        return host_envs_for(world_size, os.environ)

    def setup_host(self, host, world_size, workdir):
        from ddp_impl.runtime import ranks, xrt as _x  # loads torch (see max_world_size)
        reason = _x.xrt_detect()
        if reason:
            raise RuntimeUnavailable(reason)
        # torch_xla 2.0 runs PJRT whenever PJRT_DEVICE is set; an inherited
        # XRT_HOST_ORDINAL would mean the sea-of-devices layout, not this one.
        os.environ.pop(_x.PJRT_DEVICE, None)
        os.environ.pop(_x.HOST_ORDINAL, None)
        if os.environ.get(_x.SHARD_ORDINAL, "0") != "0":
            # _setup_tpu_worker: only the mesh master keeps the TPU configuration
            # (inherited from the parent here, so removed rather than not set).
            os.environ.pop(_x.TPU_CONFIG, None)
            os.environ.pop(_x.TPU_NUM_DEVICES, None)
        b = _x.xrt_bindings(os.environ)
        if (b.global_ordinal, b.world_size) != (host, world_size):
            raise RuntimeError(f"host {host} of {world_size} got XRT bindings {b}")
        import torch_xla.core.xla_model as xm  # after the environment is final
        device = xm.xla_device()
        if world_size > 1:
            xm.set_replication(device, [device])  # xmp._setup_replication
        ranks.bind_thread(b)
        return [ReplicaContext(runtime=self.name, rank=b.global_ordinal, world_size=b.world_size,
                               device=device, collectives=XrtCollectives(b.global_ordinal, b.world_size),
                               bindings=b, mark_step=xm.mark_step)]

    def teardown_host(self, replicas):
        # Process 0 serves the mesh: keep it until every replica is done.
        if replicas and replicas[0].world_size > 1:
            try:
                import torch_xla.core.xla_model as xm
                xm.rendezvous("ddp-conformance-teardown")
            except Exception:
                pass
