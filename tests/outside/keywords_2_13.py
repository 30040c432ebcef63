"""Faulty DDPs for torch 2.13's constructor keywords (init_sync, broadcast_buffers,
forward_sync_buffers, bucket_cap_mb_list, batched_grad_copy, skip_all_reduce_unused_params),
written from outside by a helper given the README and the fault kind only.

Each class subclasses torch's DDP and injects ONE bug, active only when the keyword it concerns
is used, so the rest of the behaviour is torch's own (catalog entries keywords_*).
"""
import warnings

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as _TorchDDP


def _done(tensor):
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


# ---------------------------------------------------------------- buffers
class FsbAsLegacyBroadcast(_TorchDDP):
    """Bug: maps the new `forward_sync_buffers` onto the deprecated
    `broadcast_buffers` ("they mean the same thing"), so
    forward_sync_buffers=False also turns OFF the construction-time buffer
    broadcast (documented: init buffer sync stays on)."""

    def __init__(self, module, *args, forward_sync_buffers=None,
                 broadcast_buffers=None, **kwargs):
        if forward_sync_buffers is not None:
            broadcast_buffers = forward_sync_buffers
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            super().__init__(module, *args, broadcast_buffers=broadcast_buffers,
                             **kwargs)


class LegacyBroadcastAsFsb(_TorchDDP):
    """Bug: translates the deprecated `broadcast_buffers` into
    `forward_sync_buffers`, so broadcast_buffers=False still broadcasts
    buffers at construction (documented: it excludes buffers from init sync)."""

    def __init__(self, module, *args, broadcast_buffers=None,
                 forward_sync_buffers=None, **kwargs):
        if broadcast_buffers is not None and forward_sync_buffers is None:
            forward_sync_buffers = broadcast_buffers
        super().__init__(module, *args, forward_sync_buffers=forward_sync_buffers,
                         **kwargs)


class LegacyBroadcastWins(_TorchDDP):
    """Bug: precedence inverted. When both keywords are given, the deprecated
    `broadcast_buffers` is honoured and `forward_sync_buffers` is dropped
    (documented: broadcast_buffers is ignored when forward_sync_buffers is
    provided)."""

    def __init__(self, module, *args, broadcast_buffers=None,
                 forward_sync_buffers=None, **kwargs):
        if broadcast_buffers is not None:
            forward_sync_buffers = None  # checked the deprecated one first
        super().__init__(module, *args, broadcast_buffers=broadcast_buffers,
                         forward_sync_buffers=forward_sync_buffers, **kwargs)


# ---------------------------------------------------------------- init_sync
class InitSyncFalseStillSyncsBuffers(_TorchDDP):
    """Bug: init_sync=False gates only the parameter broadcast; buffers are
    still broadcast from rank 0 at construction (the buffer branch only looks
    at broadcast_buffers/forward_sync_buffers)."""

    def __init__(self, module, *args, init_sync=True, **kwargs):
        super().__init__(module, *args, init_sync=init_sync, **kwargs)
        if not init_sync:
            fsb = kwargs.get("forward_sync_buffers")
            bb = kwargs.get("broadcast_buffers")
            init_sync_buffers = True if fsb is not None else (bb is None or bool(bb))
            if init_sync_buffers:
                ignore = set(getattr(self, "parameters_to_ignore", ()))
                bufs = [b for n, b in self.module.named_buffers() if n not in ignore]
                with torch.no_grad():
                    for b in bufs:
                        dist.broadcast(b, src=dist.get_global_rank(self.process_group, 0)
                                       if self.process_group is not None else 0,
                                       group=self.process_group)


class InitSyncIgnored(_TorchDDP):
    """Bug: `init_sync` is accepted but never forwarded, so parameters and
    buffers are broadcast from rank 0 even with init_sync=False."""

    def __init__(self, module, *args, init_sync=True, **kwargs):
        super().__init__(module, *args, **kwargs)


# ---------------------------------------------------------------- buckets
class BucketListDropsLastBucket(_TorchDDP):
    """Bug: a bucket planner driven by bucket_cap_mb_list flushes a bucket only
    when the next parameter overflows its cap and forgets to flush the final
    partial bucket when there is more than one; that bucket's gradients are
    never all-reduced (left local, not averaged)."""

    def __init__(self, module, *args, bucket_cap_mb_list=None, **kwargs):
        super().__init__(module, *args, bucket_cap_mb_list=bucket_cap_mb_list,
                         **kwargs)
        if bucket_cap_mb_list:
            def hook(pg, bucket):
                if bucket.is_last() and bucket.index() > 0:
                    return _done(bucket.buffer())  # never reduced
                return default_hooks.allreduce_hook(pg, bucket)

            _TorchDDP.register_comm_hook(self, self.process_group, hook)


# ---------------------------------------------------------------- batched copy
class BatchedCopyNoAverage(_TorchDDP):
    """Bug: the batched_grad_copy=True fast path fuses the per-parameter copy
    into one _foreach_copy_ but drops the flat div_ by world size, so gradients
    are summed over replicas instead of averaged."""

    def __init__(self, module, *args, batched_grad_copy=False, **kwargs):
        super().__init__(module, *args, batched_grad_copy=batched_grad_copy,
                         **kwargs)
        if batched_grad_copy:
            def hook(pg, bucket):
                buf = bucket.buffer()
                work = dist.all_reduce(buf, group=pg, async_op=True)
                return work.get_future().then(lambda f: f.value()[0])  # no div_

            _TorchDDP.register_comm_hook(self, self.process_group, hook)


# ---------------------------------------------------------------- unused params
class SkipUnusedAnyInBucket(_TorchDDP):
    """Bug: with skip_all_reduce_unused_params=True a bucket's all-reduce is
    skipped when ANY of its parameters is unused (should be: only when all are),
    so used parameters sharing a bucket with an unused one keep their local,
    unreduced gradient."""

    def __init__(self, module, *args, skip_all_reduce_unused_params=False,
                 **kwargs):
        super().__init__(module, *args,
                         skip_all_reduce_unused_params=skip_all_reduce_unused_params,
                         **kwargs)
        if skip_all_reduce_unused_params:
            def hook(pg, bucket):
                grads = bucket.gradients()
                used = torch.tensor([float(bool(g.ne(0).any())) for g in grads],
                                    dtype=torch.float32)
                dist.all_reduce(used, op=dist.ReduceOp.MAX, group=pg)
                if bool((used == 0).any()):  # any() where all() was meant
                    return _done(bucket.buffer())
                return default_hooks.allreduce_hook(pg, bucket)

            _TorchDDP.register_comm_hook(self, self.process_group, hook)
