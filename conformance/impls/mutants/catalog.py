"""The mutant catalog: deliberately broken DDPs every check table must kill.

Each mutant is the reference DDP (:class:`ddp_impl.DistributedDataParallel`)
with one seam broken, a torch DDP with one method broken, a correct DDP fed
the wrong shard, or one of PyTorch's shipped data-parallel paths (the rows of
``conformance/impls/torch_paths.py``: FSDP2, ZeRO, torch.compile) with one fault.
Operators follow real data-parallel bugs (cf. DeepCrime's catalogue of DL
faults). Which cases must kill a mutant is stated in one place
only: the ``must_kill`` column of the case table (``conformance/cases/table.py``),
which checks at import that every mutant here is named by some case.

Long because it is a data table: one short class per mutant (a single fault each) and its row
of :data:`MUTANTS`, kept together so the catalog reads (and is checked) as one list.
"""
from __future__ import annotations

from dataclasses import dataclass
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook  # torch.optim does not bind .optimizer

from ddp_impl import DistributedDataParallel as RefDDP
from ddp_impl.runtime import ranks
from ddp_impl.runtime.collectives import default_collectives

from conformance.impls.mutants import scratch as S
import contextlib
from conformance.impls.torch_paths import fsdp2_row, torch_compile_row, zero_row
from ddp_impl.sync_batchnorm import SyncBatchNorm

SCRATCH_ON_PJRT = ("written on torch.distributed (gloo collectives); the PJRT world has no "
                   "process-per-replica torch.distributed group")
KEYWORDS_ON_PJRT = ("torch 2.13's DDP keywords (init_sync=False, forward_sync_buffers, bucket_cap_mb_list, "
                    "batched_grad_copy): torch_xla pins an older torch")



class NoGradSync(RefDDP):
    """Gradients are never all-reduced: every replica trains on its shard alone."""

    def _reduce_bucket(self, bucket):
        return None  # no all-reduce: each gradient is written back as computed locally


class SumNotMean(RefDDP):
    """All-reduce sums gradients but never divides by the world size."""

    def _grad_scale(self):
        return 1.0


class WrongCount(RefDDP):
    """Mean over the wrong count: divides by world_size + 1 (off by one)."""

    def _grad_scale(self):
        return 1.0 / (self.collectives.world_size + 1)


class ScaleTwice(RefDDP):
    """The 1/world_size scale is applied twice (1/world_size**2)."""

    def _grad_scale(self):
        return 1.0 / self.collectives.world_size ** 2


class NoInitialBroadcast(RefDDP):
    """Module states are not broadcast at construction (replicas start apart)."""

    def _sync_module_states(self):
        pass


class BuffersNotBroadcast(RefDDP):
    """``broadcast_buffers=True`` is accepted but buffers are never broadcast."""

    def _sync_buffers(self):
        pass


class LastParamUnsynced(RefDDP):
    """Every parameter's gradient is synced except the last one's."""

    @torch.no_grad()
    def _reduce_bucket(self, bucket):
        last = list(self.module.parameters())[-1]
        for p, g in zip(bucket.params, bucket.grads):
            if p is last:  # its local gradient, before the bucket is reduced
                self._last_local = g.clone()
        return super()._reduce_bucket(bucket)

    def _set_grad(self, param, reduced):
        last = param is list(self.module.parameters())[-1]
        super()._set_grad(param, self.__dict__.pop("_last_local") if last else reduced)


class StaleGradient(RefDDP):
    """The step applies the previous step's synced gradient (zero at step 1)."""

    @torch.no_grad()
    def _set_grad(self, param, reduced):
        stale = getattr(param, "_stale_grad", None)
        super()._set_grad(param, stale if stale is not None else torch.zeros_like(reduced))
        param._stale_grad = reduced.clone()


class ClipLocalGrad(RefDDP):
    """Each replica clips its *local* gradient to total norm 1.0 before the
    all-reduce (the real bug of clipping local instead of global gradients:
    the update is no longer linear in the loss)."""

    max_norm = 1.0

    def _launch_ready(self, final=False):
        if not final:  # the local norm is known only when backward is done
            return
        torch.nn.utils.clip_grad_norm_([p for b in self._buckets for p in b.params], self.max_norm)
        super()._launch_ready(final)


class BuffersAlwaysBroadcast(RefDDP):
    """``broadcast_buffers=False`` is accepted but buffers are broadcast anyway."""

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._sync_buffers()
        return self.module(*args, **kwargs)


class UnusedZeroFilled(RefDDP):
    """Globally unused parameters get zero gradients instead of staying ``None``."""

    @torch.no_grad()
    def _finalize_backward(self):
        super()._finalize_backward()
        for p in self.module.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


# --- the loop around the DDP (issue 25; docs/scenarios.md, "The loop programs") ---------------

class ReduceOnlyInTraining(RefDDP):
    """Gradients are averaged only while the module is in train mode: a backward in eval mode
    (fine-tuning with frozen statistics) leaves every replica with its local gradient."""

    def _on_grad_ready(self, param):
        if self.module.training:
            super()._on_grad_ready(param)


class EvalForwardSkipsBufferSync(RefDDP):
    """A forward in eval mode does not broadcast the buffers (as if only training forwards needed
    them) but still clears the forward-sync flag: after an eval-mode validation forward the next
    training forward runs on each replica's own buffers, where DDP's are rank 0's."""

    def forward(self, *args, **kwargs):
        if self.module.training:
            return super().forward(*args, **kwargs)
        keep, self.broadcast_buffers = self.broadcast_buffers, False
        try:
            return super().forward(*args, **kwargs)
        finally:
            self.broadcast_buffers = keep


class BufferSyncIgnoresGradMode(RefDDP):
    """The forward-sync flag ignores the grad mode: a forward under ``no_grad`` counts as a synced
    one, so the next forward broadcasts the buffers (DDP's ``_post_forward`` clears the flag
    there: the buffers a train-mode ``no_grad`` forward updated stay each replica's own)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        self.require_forward_param_sync = self.require_backward_grad_sync
        return out


class BufferSyncOncePerIteration(RefDDP):
    """Buffers are broadcast once per training iteration, at the first forward after a synced
    backward (or construction), where DDP broadcasts before every forward that follows a synced
    grad-enabled one: of two forwards before one backward (a GAN's discriminator) the second runs
    on each replica's own buffers, and so does the training forward after a grad-enabled
    validation forward no backward followed."""

    def forward(self, *args, **kwargs):
        keep, armed = self.broadcast_buffers, getattr(self, "_backward_synced", True)
        broadcasts = keep and armed and self.require_forward_param_sync
        self.broadcast_buffers = keep and armed
        try:
            out = super().forward(*args, **kwargs)
        finally:
            self.broadcast_buffers = keep
        if broadcasts:
            self._backward_synced = False  # again only after the next synced backward
        return out

    def _finalize_backward(self):
        super()._finalize_backward()
        self._backward_synced = True


class ForwardSyncFlagShared(RefDDP):
    """The forward-sync flag is kept per class, not per instance: every DDP in the process shares it,
    so a second model's forward (a frozen teacher under ``no_grad``, a GAN's other network) sets or
    clears the trained model's buffer broadcast (torch keeps ``require_forward_param_sync`` on each
    DDP)."""

    _shared = {"require_forward_param_sync": True}

    @property
    def require_forward_param_sync(self):
        return ForwardSyncFlagShared._shared["require_forward_param_sync"]

    @require_forward_param_sync.setter
    def require_forward_param_sync(self, value):
        ForwardSyncFlagShared._shared["require_forward_param_sync"] = value


class ForwardSyncFlagClearedFirst(RefDDP):
    """The forward-sync flag is cleared before the module runs and set again when it returns, so a
    forward whose module raises (a bad batch the loop catches and skips) leaves it cleared: the
    next forward skips the buffer broadcast torch does (torch sets the flag only after the module
    returned, so a raising forward keeps the previous one's)."""

    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        keep, self.broadcast_buffers = self.broadcast_buffers, False
        self.require_forward_param_sync = False
        try:
            return super().forward(*args, **kwargs)
        finally:
            self.broadcast_buffers = keep


class SyncedForwardZeroesGrads(RefDDP):
    """Assumes one synced backward per optimizer step: a forward that follows a synced one drops
    the gradients (``grad = None``), so of two synced backwards in one step only the second's
    gradient reaches the step, and a zero gradient from ``zero_grad(set_to_none=False)`` becomes
    ``None``."""

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync and self.require_forward_param_sync:
            for p in self.module.parameters():
                p.grad = None
        return super().forward(*args, **kwargs)


class UnusedByThisBackwardDropped(RefDDP):
    """With ``find_unused_parameters``, a parameter no replica's *this* backward reached gets
    ``grad = None``, though it held a gradient: a zero one (``zero_grad(set_to_none=False)``, which
    weight decay still applies) or an earlier synced backward's average in the same step."""

    def _global_use_counts(self, params, used):
        return super()._global_use_counts(params, [id(p) in self._fired for p in params])


class MeanAtOptimizerStep(RefDDP):
    """Gradients are all-reduced as sums; the division by the world size is deferred to an
    optimizer step pre-hook (fused into the step). Any loop that reads the synced gradients
    before the step (``clip_grad_norm_``) sees world size x the mean."""

    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        me, mine = weakref.ref(self), {id(p) for p in module.parameters()}

        def divide(opt, args, kwargs):
            ddp = me()
            if ddp is None:
                return
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) in mine and p.grad is not None:
                        p.grad.div_(ddp.collectives.world_size)
        handle = register_optimizer_step_pre_hook(divide)  # on every optimizer
        weakref.finalize(self, handle.remove)  # a world reused by later cases keeps no hook

    def _grad_scale(self):
        return 1.0


class UnusedSkipped(RefDDP):
    """Locally unused parameters are not reduced (replicas that used one keep
    their local gradient)."""

    def _global_use_counts(self, params, used):
        counts = super()._global_use_counts(params, used)
        w = self.collectives.world_size
        self._partly_used = {id(p) for p, n in zip(params, counts) if 0 < n < w}
        return counts

    def _set_grad(self, param, reduced):
        if id(param) not in self.__dict__.get("_partly_used", ()):  # bug: only the all-used ones
            super()._set_grad(param, reduced)


class NoSyncIgnored(RefDDP):
    """``no_sync()`` is a no-op: gradients are all-reduced every micro-step."""

    def no_sync(self):
        return contextlib.nullcontext()


class NoSyncSticky(RefDDP):
    """``no_sync()`` never re-enables synchronisation when the block exits."""

    def no_sync(self):
        self.require_backward_grad_sync = False
        return contextlib.nullcontext()


class DroppedBucket(RefDDP):
    """Honours ``bucket_cap_mb`` (buckets of parameters in reverse order, as
    upstream) but never all-reduces bucket 1."""

    def _reduce_bucket(self, bucket):
        return None if bucket.index == 1 else super()._reduce_bucket(bucket)


class ExactFullBucketDropped(RefDDP):
    """Honours ``bucket_cap_mb`` but skips the all-reduce of the last bucket when it is exactly
    full (its bytes equal the cap: an off-by-one in a ``>`` / ``>=`` bucket-closing test)."""

    def __init__(self, module, *args, bucket_cap_mb=None, **kwargs):
        super().__init__(module, *args, bucket_cap_mb=bucket_cap_mb, **kwargs)
        self._cap_bytes = None if bucket_cap_mb is None else int(bucket_cap_mb * 2 ** 20)

    def _reduce_bucket(self, bucket):
        full = sum(p.numel() * p.element_size() for p in bucket.params) == self._cap_bytes
        if full and bucket.index == len(self._buckets) - 1:
            return None
        return super()._reduce_bucket(bucket)


class StaticGraphStale(RefDDP):
    """Honours ``static_graph`` by caching each parameter's first reduced
    gradient and replaying it on later steps."""

    @torch.no_grad()
    def _set_grad(self, param, reduced):
        cache = self.__dict__.setdefault("_cache", {})
        if id(param) not in cache:
            cache[id(param)] = reduced.clone()
        super()._set_grad(param, cache[id(param)].clone())


class UnfreezesParams(RefDDP):
    """Construction sets ``requires_grad=True`` on every parameter (frozen
    layers then train)."""

    def __init__(self, module, **kw):
        module.requires_grad_(True)
        super().__init__(module, **kw)


class UntiesSharedWeights(RefDDP):
    """The construction broadcast writes into fresh tensors per parameter name,
    breaking weight tying (as loading a state_dict into copies does)."""

    @torch.no_grad()
    def _sync_module_states(self):
        for mod in self.module.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    fresh = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                    self.collectives.broadcast_(fresh.data, src=0)
                    mod._parameters[name] = fresh
        for b in self.module.buffers() if self.broadcast_buffers else ():
            self.collectives.broadcast_(b, src=0)


class StateDictDropsBuffers(RefDDP):
    """``state_dict()`` leaves out buffers, so a reload starts from fresh ones."""

    def state_dict(self, *args, **kwargs):
        sd = super().state_dict(*args, **kwargs)
        names = {"module." + n for n, _ in self.module.named_buffers()}
        for k in [k for k in sd if k in names]:
            del sd[k]
        return sd


class ReduceAtFirstFiring(RefDDP):
    """A parameter is ready at its gradient hook's first firing in a backward; later
    firings (a reentrant checkpoint's second region) are dropped: the bucket is already
    launched, so the reduced gradient misses their contributions (pytorch/pytorch#84589)."""

    def _firing_completes(self, param):
        n = self._fired[id(param)] = self._fired.get(id(param), 0) + 1
        return n == 1


class FinalizeAtFirstFiring(RefDDP):
    """The end-of-backward callback is queued at the first gradient hook firing, on the
    backward then running, and a nested backward is not told apart from the outer one: for a
    parameter used outside and then inside a reentrant checkpoint, the first firing is in the
    checkpoint's nested backward, whose end all-reduces a partial gradient, and the outer
    backward's later firing starts a reduction that finds the head without a gradient and
    raises (torch's reducer queues its callback the same way and stays silent:
    docs/findings.md, finding 12)."""

    def _sink_outputs(self, out):
        return out

    def _queue_finalize(self):
        super()._queue_finalize()
        import torch
        self._outer_task = torch._C._current_graph_task_id()  # every backward looks outermost


def _torch_ddp_class():
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel


def _sum_hook(state, bucket):
    import torch.distributed as dist
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _comm_hook_no_divide():
    class CommHookNoDivide(_torch_ddp_class()):
        """torch DDP whose registered comm hook all-reduces but forgets to divide."""

        def register_comm_hook(self, state, hook):
            super().register_comm_hook(state, _sum_hook)
    return CommHookNoDivide


def _comm_hook_value_ignored():
    class CommHookValueIgnored(_torch_ddp_class()):
        """torch DDP that ignores the comm hook's future value and reads the bucket buffer back."""

        def register_comm_hook(self, state, hook):
            def reads_buffer_back(s, bucket):  # assumes the hook reduced the buffer in place
                return hook(s, bucket).then(lambda _: bucket.buffer())
            super().register_comm_hook(state, reads_buffer_back)
    return CommHookValueIgnored


def _join_dropped():

    class JoinDropped(_torch_ddp_class()):
        """torch DDP whose ``join()`` does nothing: a replica with more batches
        waits forever in an all-reduce nobody else enters."""

        def join(self, *args, **kwargs):
            return contextlib.nullcontext()
    return JoinDropped


def _forward_sync_off_skips_init():

    class ForwardSyncOffSkipsInit(_torch_ddp_class()):
        """torch DDP that reads ``forward_sync_buffers=False`` as the deprecated
        ``broadcast_buffers=False``: the construction sync of buffers is skipped too, so each
        replica keeps its own buffers (torch 2.13 syncs them at construction anyway)."""

        def __init__(self, module, forward_sync_buffers=None, **kwargs):
            if forward_sync_buffers is False:
                kwargs["broadcast_buffers"] = False
            else:
                kwargs["forward_sync_buffers"] = forward_sync_buffers
            super().__init__(module, **kwargs)
    return ForwardSyncOffSkipsInit


def _init_sync_ignored():

    class InitSyncIgnored(_torch_ddp_class()):
        """torch DDP that accepts ``init_sync=False`` and syncs at construction anyway: rank 0's
        buffers overwrite the replicas' own, which the user kept apart on purpose."""

        def __init__(self, module, init_sync=True, **kwargs):
            super().__init__(module, **kwargs)
    return InitSyncIgnored


def _last_listed_bucket_unreduced():

    class LastListedBucketUnreduced(_torch_ddp_class()):
        """torch DDP that, given ``bucket_cap_mb_list``, never reduces its last bucket (an
        off-by-one over the per-bucket caps): those gradients stay each replica's own."""

        def __init__(self, module, bucket_cap_mb_list=None, **kwargs):
            super().__init__(module, bucket_cap_mb_list=bucket_cap_mb_list, **kwargs)
            if bucket_cap_mb_list:
                super().register_comm_hook(None, _mean_but_last)
    return LastListedBucketUnreduced


def _mean_but_last(state, bucket):
    import torch
    import torch.distributed as dist
    if bucket.is_last():
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    buf = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


def _batched_copy_undivided():

    class BatchedCopyUndivided(_torch_ddp_class()):
        """torch DDP whose ``batched_grad_copy=True`` path loses the flat ``div_``: gradients
        are summed over replicas, not averaged."""

        def __init__(self, module, batched_grad_copy=False, **kwargs):
            super().__init__(module, batched_grad_copy=batched_grad_copy, **kwargs)
            if batched_grad_copy:
                super().register_comm_hook(None, _sum_hook)
    return BatchedCopyUndivided


class LoadAssigns(RefDDP):
    """``load_state_dict`` swaps in the checkpoint's tensors (``assign=True``) instead of
    copying into the live parameters: the optimizer keeps updating the old ones."""

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return super().load_state_dict(state_dict, strict=strict, assign=True)


class SyncBNLocalStats(RefDDP):
    """Converts BatchNorm to SyncBatchNorm but normalises with local statistics."""


def _shard_zero(ctx):
    return 0


def _local_stats_bn_class():

    class LocalStatsBN(SyncBatchNorm):
        def forward(self, x):  # local statistics, local backward: plain BatchNorm
            return torch.nn.BatchNorm1d.forward(self, x)
    return LocalStatsBN


# --- faults of PyTorch's shipped data-parallel paths (conformance/impls/torch_paths.py) ---
# Each is a factory of the shipped path's Strategy row with one fault built in.

def _fsdp2_no_divide():
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


def _fsdp2_wrong_mesh():
    """The ``fsdp2`` row sharded over the ``tp`` dim of a ``(dp, tp) = (W, 1)``
    mesh: fully_shard reduce-scatters over the mesh it is given (here a group of
    one), where the row's mesh spans the data-parallel world."""

    def tp_dim(ctx):
        from torch.distributed.device_mesh import init_device_mesh
        return init_device_mesh("cpu", (ctx.world_size, 1), mesh_dim_names=("dp", "tp"))["tp"]
    return fsdp2_row("fsdp2", True, mesh_of=tp_dim)


def _zero_no_param_sync():
    """The ``zero`` row with ``ZeroRedundancyOptimizer._sync_params`` a no-op.
    Upstream ``step()`` updates this rank's parameter shard, then broadcasts
    every rank's shard to all ranks (``_sync_params``)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer


    class ZeroNoParamSync(ZeroRedundancyOptimizer):
        def _sync_params(self):
            pass  # each rank keeps the shards it does not own at their old values
    return zero_row(ZeroNoParamSync)


def _torch_compile_eager():
    """The ``torch_compile`` row without its user-code root forward: for a bare
    ``torch.nn`` root dynamo compiles no graph (docs/findings.md, finding 2) and
    the row's no-graph guard (``torch_paths._require_compiled``) must refuse it."""
    return torch_compile_row(user_frame_root=False)


class GroupSumGlobalDivide(RefDDP):
    """With a process_group, sums gradients over the group but divides by the global world size
    (torch.distributed.get_world_size() of the default group) instead of the group's size: the
    divisor is not the count of what was summed (pytorch/pytorch#36516)."""

    def _grad_scale(self):
        return 1.0 / ranks.bindings().world_size  # every replica of the world


class BroadcastGlobalRank0(RefDDP):
    """With a process_group, broadcasts module states at construction over the default group from
    global rank 0 instead of from the group's first rank (a group rank used as a global one,
    meta-pytorch/torchrec#4601): every group starts from rank 0's parameters."""

    @torch.no_grad()
    def _sync_module_states(self):
        world = default_collectives()  # every replica of the world, not self.collectives' group
        states = list(self.module.parameters()) + (list(self.module.buffers()) if self.broadcast_buffers else [])
        for t in states:
            world.broadcast_(t.data, src=0)
# --- workload corners (issue 18): one fault per corner --------------------------------


class SparseGradUnsynced(RefDDP):
    """Sparse gradients (``Embedding(sparse=True)``) are left out of the reduction: each
    replica keeps its local sparse gradient (upstream reduces them: pytorch#19443, #22037)."""

    def __init__(self, module, **kwargs):
        if any(p.device.type == "xla" for p in module.parameters()):
            from conformance.errors import Unsupported
            raise Unsupported("XLA has no sparse tensors (torch_xla 2.9: Embedding(sparse=True)'s backward "
                              "raises), so a sparse-gradient fault has nothing to act on")
        super().__init__(module, **kwargs)

    def _set_grad(self, param, reduced):
        if param.grad is not None and param.grad.is_sparse:
            return  # the local sparse gradient stays
        super()._set_grad(param, reduced)


class StridedUnpack(RefDDP):
    """Gradients are packed into the bucket in logical order but unpacked through a view
    with the *parameter's* strides: a channels_last or transposed parameter gets its
    gradient permuted (the gradient layout contract, pytorch#47163)."""

    def __init__(self, module, **kwargs):
        if any(p.device.type == "xla" for p in module.parameters()):
            from conformance.errors import Unsupported
            raise Unsupported("XLA tensors carry no memory format (measured on torch_xla 2.9: a "
                              "channels_last or transposed parameter moved to the device is contiguous), "
                              "so a stride fault has nothing to permute")
        super().__init__(module, **kwargs)

    def _set_grad(self, param, reduced):
        super()._set_grad(param, reduced.as_strided(param.shape, param.stride()))


class ComplexRealBucket(RefDDP):
    """Complex gradients are copied into a real bucket: the imaginary part is lost
    (pytorch#158753)."""

    def _set_grad(self, param, reduced):
        super()._set_grad(param, reduced.real.to(reduced.dtype) if reduced.is_complex() else reduced)


class Fp32FusionBuffer(RefDDP):
    """One float32 fusion buffer for every dtype: float64 (and bfloat16) gradients are
    reduced in float32 and cast back (PiPPy#656)."""

    @torch.no_grad()
    def _reduce_bucket(self, bucket):
        if bucket.flat is None:  # reduced as a list (lazy XLA): each gradient through float32
            dtypes = [g.dtype for g in bucket.grads]
            bucket.grads = [g if g.is_complex() else g.float() for g in bucket.grads]
            super()._reduce_bucket(bucket)
            bucket.grads = [g.to(d) for g, d in zip(bucket.grads, dtypes)]
            return None
        if bucket.flat.dtype == torch.float32 or bucket.flat.is_complex():
            return super()._reduce_bucket(bucket)
        buf = self.collectives.all_reduce_(bucket.flat.float(), scale=self._grad_scale())
        bucket.flat.copy_(buf)
        return None


class OutputWalkBareTensor(RefDDP):
    """``find_unused_parameters=True`` finds the used parameters by walking the forward's
    output, but only a bare tensor: a dataclass / dict / namedtuple output yields none, so
    every parameter counts as globally unused and keeps grad ``None`` (no step)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        self._bare_output = isinstance(out, torch.Tensor)
        return out

    def _global_use_counts(self, params, used):
        counts = super()._global_use_counts(params, used)
        return counts if self.__dict__.get("_bare_output", True) else [0.0] * len(counts)


class StateDictBuffersOnly(RefDDP):
    """Broadcasts only the buffers ``state_dict()`` holds (at construction and before each
    forward): a ``persistent=False`` buffer stays per-replica."""

    def _persistent(self):
        keys = set(self.module.state_dict().keys())
        return [b for n, b in self.module.named_buffers() if n in keys]

    @torch.no_grad()
    def _sync_module_states(self):
        for t in list(self.module.parameters()) + (self._persistent() if self.broadcast_buffers else []):
            self.collectives.broadcast_(t.data, src=0)

    @torch.no_grad()
    def _sync_buffers(self):
        for b in self._persistent():
            self.collectives.broadcast_(b, src=0)


class ForwardHooksSkipped(RefDDP):
    """Runs ``module.forward(...)`` instead of ``module(...)``: the wrapped module's forward
    (pre-)hooks never run."""

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync and self._queued:
            self._reset()
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        out = self.module.forward(*args, **kwargs)  # bug: bypasses nn.Module.__call__
        self.require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        return self._sink_outputs(out) if self.require_forward_param_sync else out


class ContainerParamsUnsynced(RefDDP):
    """Parameters held by an ``nn.ParameterList`` / ``nn.ParameterDict`` are left out of the
    reduction (collected per layer, containers missed): each replica keeps its local gradient."""

    def _set_grad(self, param, reduced):
        held = {id(p) for m in self.module.modules() if isinstance(m, (torch.nn.ParameterList, torch.nn.ParameterDict))
                for p in m.parameters(recurse=False)}
        if id(param) not in held:  # bug: container-held gradients stay local
            super()._set_grad(param, reduced)


class ParametrizedLayerSync(RefDDP):
    """The construction broadcast walks each layer's tensors by attribute (``layer.weight``):
    a parametrized weight is computed, so the broadcast lands in a temporary and the trained
    ``...parametrizations.weight.original`` stays per-replica."""

    @torch.no_grad()
    def _sync_module_states(self):
        from torch.nn.utils import parametrize
        states = []
        for m in self.module.modules():
            if isinstance(m, parametrize.ParametrizationList):
                continue  # bug: reached through the layer's attribute instead
            states += [p for p in m._parameters.values() if p is not None]
            if parametrize.is_parametrized(m):
                states += [getattr(m, n) for n in m.parametrizations]  # computed: a temporary
        if self.broadcast_buffers:
            states += list(self.module.buffers())
        for t in states:
            self.collectives.broadcast_(t.data, src=0)


class ForwardKwargsDropped(RefDDP):
    """Calls ``module(*args)`` only: the forward's keyword arguments (``scale=``, ``mask=``, ...)
    never reach the module, which runs with its defaults (a wrapper written as ``def forward(self,
    *inputs)``)."""

    def forward(self, *args, **kwargs):
        return super().forward(*args)  # bug: kwargs dropped


class FloatBuffersOnly(RefDDP):
    """Broadcasts only floating-point buffers (at construction and before each forward): an
    integer buffer (an int64 step or sample counter) stays per-replica (a coalesced broadcast
    built in one float dtype, integer buffers filtered out)."""

    @torch.no_grad()
    def _sync_module_states(self):
        states = list(self.module.parameters())
        if self.broadcast_buffers:
            states += [b for b in self.module.buffers() if b.is_floating_point() or b.is_complex()]
        for t in states:
            self.collectives.broadcast_(t.data, src=0)

    @torch.no_grad()
    def _sync_buffers(self):
        for b in self.module.buffers():
            if b.is_floating_point() or b.is_complex():  # bug: integer buffers skipped
                self.collectives.broadcast_(b, src=0)


@dataclass(frozen=True)
class Mutant:
    """One catalog row. ``ddp_class`` is a class, or a zero-argument factory
    returning one (for torch-DDP-based mutants, built lazily); ``torch_based``
    ones are constructed without the replica's collectives; ``sync_bn`` is the
    SyncBatchNorm class the mutant converts BatchNorm layers to; ``honours``
    lists torch DDP keywords the mutant implements although the reference
    ignores them (so cases requiring them run); ``shipped_path`` is a zero-argument
    factory of a shipped path's row (``conformance.impls.torch_paths``) with the fault built in,
    used instead of ``ddp_class``."""

    name: str
    description: str
    ddp_class: object
    shard_rank: object = None
    torch_based: bool = False
    sync_bn: object = None
    honours: tuple = ()
    unsupported: dict | None = None
    shipped_path: object = None


MUTANTS = {m.name: m for m in [
    Mutant("no_grad_sync", NoGradSync.__doc__, NoGradSync),
    Mutant("sum_not_mean", SumNotMean.__doc__, SumNotMean),
    Mutant("wrong_count", WrongCount.__doc__, WrongCount),
    Mutant("no_initial_broadcast", NoInitialBroadcast.__doc__, NoInitialBroadcast),
    Mutant("buffers_not_broadcast", BuffersNotBroadcast.__doc__, BuffersNotBroadcast),
    Mutant("last_param_unsynced", LastParamUnsynced.__doc__, LastParamUnsynced),
    Mutant("scale_twice", ScaleTwice.__doc__, ScaleTwice),
    Mutant("stale_gradient", StaleGradient.__doc__, StaleGradient),
    Mutant("shard_mixup", "Correct DDP, but every replica trains on shard 0 (rank binding "
           "returns 0).", RefDDP, shard_rank=_shard_zero),
    Mutant("clip_local_grad", ClipLocalGrad.__doc__, ClipLocalGrad),
    Mutant("buffers_always_broadcast", BuffersAlwaysBroadcast.__doc__, BuffersAlwaysBroadcast),
    Mutant("unused_zero_filled", UnusedZeroFilled.__doc__, UnusedZeroFilled),
    Mutant("unused_skipped", UnusedSkipped.__doc__, UnusedSkipped),
    Mutant("reduce_only_in_training", ReduceOnlyInTraining.__doc__, ReduceOnlyInTraining),
    Mutant("eval_forward_skips_buffer_sync", EvalForwardSkipsBufferSync.__doc__, EvalForwardSkipsBufferSync),
    Mutant("buffer_sync_ignores_grad_mode", BufferSyncIgnoresGradMode.__doc__, BufferSyncIgnoresGradMode),
    Mutant("buffer_sync_once_per_iteration", BufferSyncOncePerIteration.__doc__, BufferSyncOncePerIteration),
    Mutant("forward_sync_flag_shared", ForwardSyncFlagShared.__doc__, ForwardSyncFlagShared),
    Mutant("forward_sync_flag_cleared_first", ForwardSyncFlagClearedFirst.__doc__, ForwardSyncFlagClearedFirst),
    Mutant("synced_forward_zeroes_grads", SyncedForwardZeroesGrads.__doc__, SyncedForwardZeroesGrads),
    Mutant("unused_by_this_backward_dropped", UnusedByThisBackwardDropped.__doc__, UnusedByThisBackwardDropped),
    Mutant("mean_at_optimizer_step", MeanAtOptimizerStep.__doc__, MeanAtOptimizerStep),
    Mutant("no_sync_ignored", NoSyncIgnored.__doc__, NoSyncIgnored),
    Mutant("no_sync_sticky", NoSyncSticky.__doc__, NoSyncSticky),
    Mutant("dropped_bucket", DroppedBucket.__doc__, DroppedBucket),
    Mutant("exact_full_bucket_dropped", ExactFullBucketDropped.__doc__, ExactFullBucketDropped),
    Mutant("static_graph_stale", StaticGraphStale.__doc__, StaticGraphStale),
    Mutant("unfreezes_params", UnfreezesParams.__doc__, UnfreezesParams),
    Mutant("unties_shared_weights", UntiesSharedWeights.__doc__, UntiesSharedWeights),
    Mutant("state_dict_drops_buffers", StateDictDropsBuffers.__doc__, StateDictDropsBuffers),
    Mutant("load_assigns", LoadAssigns.__doc__, LoadAssigns),
    Mutant("reduce_at_first_firing", ReduceAtFirstFiring.__doc__, ReduceAtFirstFiring),
    Mutant("finalize_at_first_firing", FinalizeAtFirstFiring.__doc__, FinalizeAtFirstFiring),
    Mutant("comm_hook_no_divide", "torch DDP whose registered comm hook all-reduces but forgets "
           "to divide.", _comm_hook_no_divide, torch_based=True),
    Mutant("comm_hook_value_ignored", "torch DDP that ignores the comm hook's future value and "
           "reads the bucket buffer back (assumes an in-place hook such as allreduce_hook): a hook "
           "returning a new tensor leaves every replica with its local gradient.",
           _comm_hook_value_ignored, torch_based=True),
    Mutant("join_dropped", "torch DDP whose join() does nothing: the replica with more batches "
           "hangs in an all-reduce.", _join_dropped, torch_based=True),
    # torch 2.13's keywords (scenario.keywords), on torch's own DDP.
    *[Mutant(name, doc, factory, torch_based=True,
             unsupported={"pjrt": KEYWORDS_ON_PJRT})
      for name, factory, doc in (
          ("forward_sync_off_skips_init", _forward_sync_off_skips_init,
           "torch DDP that reads forward_sync_buffers=False as broadcast_buffers=False: the "
           "construction sync of buffers is skipped too."),
          ("init_sync_ignored", _init_sync_ignored,
           "torch DDP that accepts init_sync=False and syncs parameters and buffers at construction anyway."),
          ("last_listed_bucket_unreduced", _last_listed_bucket_unreduced,
           "torch DDP that, given bucket_cap_mb_list, never reduces its last bucket."),
          ("batched_copy_undivided", _batched_copy_undivided,
           "torch DDP whose batched_grad_copy=True path sums gradients instead of averaging them."))],
    Mutant("sync_bn_local_stats", SyncBNLocalStats.__doc__, SyncBNLocalStats,
           sync_bn=_local_stats_bn_class),
    # Scenario kinds, on a from-scratch DDP (conformance/impls/mutants/scratch.py).
    *[Mutant(name, cls.__doc__, cls, torch_based=True, unsupported={"pjrt": SCRATCH_ON_PJRT})
      for name, cls in (("unused_accum_dropped", S.UnusedAccumDropped),
                        ("arrival_order_pairing", S.ArrivalOrderPairing),
                        ("cached_buffer_list", S.CachedBufferList), ("replica_drift", S.ReplicaDrift),
                        ("late_desync", S.LateDesync), ("batch_weighted", S.BatchWeighted),
                        ("fp16_allreduce", S.Fp16AllReduce), ("param_swap", S.ParamSwap),
                        ("rng_sync", S.RngSync), ("rng_consume", S.RngConsume),
                        ("train_mode_at_wrap", S.TrainModeAtWrap), ("unfreeze_at_wrap", S.UnfreezeAtWrap),
                        ("state_dict_unprefixed", S.StateDictUnprefixed),
                        ("output_flattened", S.OutputFlattened), ("user_hook_bypassed", S.UserHookBypassed),
                        ("params_relaid", S.ParamsRelaid), ("default_dtype_leak", S.DefaultDtypeLeak))],
    # PyTorch's shipped paths (conformance/impls/torch_paths.py), one fault each.
    Mutant("fsdp2_no_divide", "fully_shard with set_gradient_divide_factor(1.0): the gradient "
           "reduce-scatter sums instead of averaging (W x the gradient; a divide factor set for a "
           "pre-scaled loss or another world size).", None, shipped_path=_fsdp2_no_divide),
    Mutant("fsdp2_wrong_mesh", "fully_shard on the size-1 'tp' dim of a (dp, tp) = (W, 1) mesh "
           "instead of 'dp': gradients are reduced over a group of one, each replica trains on its "
           "own shard (the wrong-mesh-dim bug of 2-D parallel setups).", None,
           shipped_path=_fsdp2_wrong_mesh),
    Mutant("zero_no_param_sync", "ZeroRedundancyOptimizer whose step() skips the post-step "
           "broadcast of parameter shards (_sync_params): each replica updates only the shard it "
           "owns, so parameters diverge (ZeRO's lost all-gather of updated shards).", None,
           shipped_path=_zero_no_param_sync),
    Mutant("torch_compile_eager", "torch.compile(DDP(m)) over a bare torch.nn root: dynamo compiles "
           "no graph and every step runs eagerly (pytorch#140416, docs/findings.md 2); the row's "
           "no-graph guard must refuse it rather than pass eager DDP as compiled.", None,
           shipped_path=_torch_compile_eager),
    Mutant("group_sum_global_divide", GroupSumGlobalDivide.__doc__, GroupSumGlobalDivide),
    Mutant("broadcast_global_rank0", BroadcastGlobalRank0.__doc__, BroadcastGlobalRank0),
    # Workload corners (fixtures/models.py; docs/scenarios.md "The workload axis").
    Mutant("sparse_grad_unsynced", SparseGradUnsynced.__doc__, SparseGradUnsynced),
    Mutant("strided_unpack", StridedUnpack.__doc__, StridedUnpack),
    Mutant("complex_real_bucket", ComplexRealBucket.__doc__, ComplexRealBucket),
    Mutant("fp32_fusion_buffer", Fp32FusionBuffer.__doc__, Fp32FusionBuffer),
    # The module axis (docs/scenarios.md, "The module axis").
    Mutant("output_walk_bare_tensor", OutputWalkBareTensor.__doc__, OutputWalkBareTensor),
    Mutant("state_dict_buffers_only", StateDictBuffersOnly.__doc__, StateDictBuffersOnly),
    Mutant("forward_hooks_skipped", ForwardHooksSkipped.__doc__, ForwardHooksSkipped),
    Mutant("container_params_unsynced", ContainerParamsUnsynced.__doc__, ContainerParamsUnsynced),
    Mutant("parametrized_layer_sync", ParametrizedLayerSync.__doc__, ParametrizedLayerSync),
    Mutant("forward_kwargs_dropped", ForwardKwargsDropped.__doc__, ForwardKwargsDropped),
    Mutant("float_buffers_only", FloatBuffersOnly.__doc__, FloatBuffersOnly),
]}
