"""PJRT SPMD topology (torch_xla): one host process, one program over a W-device mesh.

Under ``torch_xla.runtime.use_spmd()`` one Python program drives every device: tensors are
global and XLA's partitioner splits the work along a device mesh (torch_xla's SPMD user guide).
There are no replicas in the DDP sense - no per-replica Python, gradients or parameter copies -
so this topology hosts one context: ``rank`` 0 of ``world_size`` 1, trained on the *whole*
global batch, with the mesh size in ``ctx.extra["mesh_devices"]``. ``use_spmd()`` is
process-global, which is why this is its own host process next to the thread topology of
:mod:`conformance.worlds.runtimes.pjrt` (the team's PJRT CPU notes, "SPMD on the CPU device").

Not selectable with ``--runtime``: an implementation row maps the ``pjrt`` runtime to it
(``Strategy.topology``), and :func:`conformance.worlds.runtimes.get_runtime` builds it from the
name ``pjrt_spmd:<mesh devices>``.
"""
from __future__ import annotations

from conformance.worlds.runtimes.base import ReplicaContext, RuntimeUnavailable, run_task
from conformance.worlds.runtimes.pjrt import PjrtRuntime, flushed
from conformance.errors import Unsupported

NAME = "pjrt_spmd"


class _NoCollectives:
    """The context's collectives: an SPMD program has no replica-level collectives
    (XLA inserts them when it partitions the graph), so each one refuses."""

    rank, world_size = 0, 1

    def _refuse(self, *args, **kwargs):
        raise Unsupported("SPMD has no replica-level collectives (XLA's partitioner inserts "
                          "them): per-replica tasks cannot run in this topology")

    all_reduce_ = broadcast_ = all_gather = barrier = _refuse


class PjrtSpmdRuntime(PjrtRuntime):
    """torch_xla SPMD on the PJRT CPU device: one host, one program, ``devices`` devices.

    Args:
        devices: mesh size (the number of PJRT CPU devices, ``CPU_NUM_DEVICES``).
    """

    name = NAME
    # XLA's BatchNorm updates running_var with the biased variance here too, and
    # SyncBatchNorm runs as that op (no process group under SPMD): feature.sync_batchnorm
    # fails against the reference without the second quirk.
    reference_quirks = frozenset({"bn_running_var_biased", "sync_bn_running_var_biased"})
    topologies = {}  # a topology world has none of its own
    hosts_field = None  # one host process, one program
    make_process_group = None  # no replica-level collectives (XLA's partitioner inserts them)

    def __init__(self, devices: int):
        self.devices = devices

    def check(self, world_size):
        if world_size != 1:
            raise RuntimeUnavailable(f"the SPMD topology runs one program (world size 1), got {world_size}")
        super().check(self.devices)

    def host_envs(self, world_size):
        return super().host_envs(self.devices)

    def setup_host(self, host, world_size, workdir):
        import torch
        from ddp_impl.runtime import xla
        from ddp_impl.runtime.types import RankBindings
        torch_xla = xla.require_torch_xla()
        import torch_xla.runtime as xr
        xr.use_spmd()
        if xr.global_runtime_device_count() != self.devices:
            raise RuntimeError(f"SPMD sees {xr.global_runtime_device_count()} device(s), expected {self.devices}")
        dev = torch_xla.device()
        bindings = RankBindings(process_index=0, process_count=1, global_ordinal=0, local_ordinal=0,
                                world_size=1, local_device_count=self.devices)
        ctx = ReplicaContext(runtime=self.name, rank=0, world_size=1, device=torch.device(str(dev)),
                             collectives=_NoCollectives(), bindings=bindings, mark_step=torch_xla.sync,
                             extra={"mesh_devices": self.devices, "torch_xla_version": torch_xla.__version__})
        return [ctx]

    def execute(self, replicas, fn, payload, on_raise=None, task=None, timeout=None):
        return [run_task(ctx, flushed(fn), payload, on_raise, task) for ctx in replicas]
