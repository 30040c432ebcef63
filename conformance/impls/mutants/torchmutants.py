"""Mutants on torch's own code: ``torch.nn.parallel.DistributedDataParallel`` with one method
broken (comm hooks, ``join``, torch 2.13's keywords), and PyTorch's shipped data-parallel paths
(the rows of :mod:`conformance.impls.torch_paths`: FSDP2, ZeRO, torch.compile) with one fault.
Rows of :data:`conformance.impls.mutants.catalog.MUTANTS` name them by reference.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from conformance.impls.torch_paths import fsdp2_row, torch_compile_row, zero_row


def _sum_hook(state, bucket):
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _mean_but_last(state, bucket):
    if bucket.is_last():
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    buf = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


class CommHookNoDivide(TorchDDP):
    """torch DDP whose registered comm hook all-reduces but forgets to divide."""

    def register_comm_hook(self, state, hook):
        super().register_comm_hook(state, _sum_hook)


class CommHookValueIgnored(TorchDDP):
    """torch DDP that ignores the comm hook's future value and reads the bucket buffer back."""

    def register_comm_hook(self, state, hook):
        def reads_buffer_back(s, bucket):  # assumes the hook reduced the buffer in place
            return hook(s, bucket).then(lambda _: bucket.buffer())
        super().register_comm_hook(state, reads_buffer_back)


class JoinDropped(TorchDDP):
    """torch DDP whose ``join()`` does nothing: a replica with more batches
    waits forever in an all-reduce nobody else enters."""

    def join(self, *args, **kwargs):
        return contextlib.nullcontext()


# --- torch 2.13's keywords (scenario.keywords) --------------------------------

class ForwardSyncOffSkipsInit(TorchDDP):
    """torch DDP that reads ``forward_sync_buffers=False`` as the deprecated
    ``broadcast_buffers=False``: the construction sync of buffers is skipped too, so each
    replica keeps its own buffers (torch 2.13 syncs them at construction anyway)."""

    def __init__(self, module, forward_sync_buffers=None, **kwargs):
        if forward_sync_buffers is False:
            kwargs["broadcast_buffers"] = False
        else:
            kwargs["forward_sync_buffers"] = forward_sync_buffers
        super().__init__(module, **kwargs)


class InitSyncIgnored(TorchDDP):
    """torch DDP that accepts ``init_sync=False`` and syncs at construction anyway: rank 0's
    buffers overwrite the replicas' own, which the user kept apart on purpose."""

    def __init__(self, module, init_sync=True, **kwargs):
        super().__init__(module, **kwargs)


class LastListedBucketUnreduced(TorchDDP):
    """torch DDP that, given ``bucket_cap_mb_list``, never reduces its last bucket (an
    off-by-one over the per-bucket caps): those gradients stay each replica's own."""

    def __init__(self, module, bucket_cap_mb_list=None, **kwargs):
        super().__init__(module, bucket_cap_mb_list=bucket_cap_mb_list, **kwargs)
        if bucket_cap_mb_list:
            super().register_comm_hook(None, _mean_but_last)


class BatchedCopyUndivided(TorchDDP):
    """torch DDP whose ``batched_grad_copy=True`` path loses the flat ``div_``: gradients
    are summed over replicas, not averaged."""

    def __init__(self, module, batched_grad_copy=False, **kwargs):
        super().__init__(module, batched_grad_copy=batched_grad_copy, **kwargs)
        if batched_grad_copy:
            super().register_comm_hook(None, _sum_hook)


# --- faults of PyTorch's shipped data-parallel paths (conformance/impls/torch_paths.py) ---
# Each is a zero-argument factory of the shipped path's Strategy row with one fault built in.

def fsdp2_no_divide():
    """The ``fsdp2`` row with every group's gradient divide factor set to 1
    (``FSDPModule.set_gradient_divide_factor(1.0)``): the reduce-scatter sums.
    Upstream's default divides by the data-parallel size W (``ReduceOp.AVG``)."""

    def divide_by_one(module):
        from torch.distributed.fsdp import FSDPModule
        for m in module.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)
                # Gloo has no PREMUL_SUM (the op a custom factor selects); the SUM path
                # applies the same factor after the reduce-scatter (factor None: 1/W).
                m.set_force_sum_reduction_for_comms(True)
    return fsdp2_row("fsdp2", True, after_shard=divide_by_one)


def fsdp2_wrong_mesh():
    """The ``fsdp2`` row sharded over the ``tp`` dim of a ``(dp, tp) = (W, 1)``
    mesh: fully_shard reduce-scatters over the mesh it is given (here a group of
    one), where the row's mesh spans the data-parallel world."""

    def tp_dim(ctx):
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh("cpu", (ctx.world_size, 1), mesh_dim_names=("dp", "tp"))["tp"]
    return fsdp2_row("fsdp2", True, mesh_of=tp_dim)


def zero_no_param_sync():
    """The ``zero`` row with ``ZeroRedundancyOptimizer._sync_params`` a no-op.
    Upstream ``step()`` updates this rank's parameter shard, then broadcasts
    every rank's shard to all ranks (``_sync_params``)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    class ZeroNoParamSync(ZeroRedundancyOptimizer):
        def _sync_params(self):
            pass  # each rank keeps the shards it does not own at their old values
    return zero_row(ZeroNoParamSync)


def torch_compile_eager():
    """The ``torch_compile`` row without its user-code root forward: for a bare
    ``torch.nn`` root dynamo compiles no graph (docs/findings.md, finding 2) and
    the row's no-graph guard (``torch_paths._require_compiled``) must refuse it."""
    return torch_compile_row(user_frame_root=False)
