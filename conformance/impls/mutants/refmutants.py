"""Mutants on the reference DDP (:class:`ddp_impl.DistributedDataParallel`): each subclass breaks
one seam (gradient sync, the scale, buffers, the loop around the DDP, buckets, graph shape,
checkpoints, process groups) the way a real data-parallel bug does. Rows of
:data:`conformance.impls.mutants.catalog.MUTANTS` name them by reference; the workload and
module-axis faults are :mod:`conformance.impls.mutants.workloadmutants`. Long because it is a
table: one short class per fault of the catalog's reference-DDP rows.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook  # torch.optim does not bind .optimizer

from ddp_impl import DistributedDataParallel as RefDDP
from ddp_impl.runtime import ranks
from ddp_impl.runtime.collectives import default_collectives
from ddp_impl.sync_batchnorm import SyncBatchNorm


def _seam(name: str, doc: str, **seams) -> type:
    """A mutant class named ``name`` whose methods ``seams`` replace the reference DDP's; ``doc``
    (what it breaks) is its docstring, its description in the catalog."""
    return type(name, (RefDDP,), {"__doc__": doc, "__module__": __name__, "__qualname__": name, **seams})


NoGradSync = _seam("NoGradSync", "Gradients are never all-reduced: every replica trains on its shard alone.",
                   _reduce_bucket=lambda self, bucket: None)  # each gradient written back as computed locally
SumNotMean = _seam("SumNotMean", "All-reduce sums gradients but never divides by the world size.",
                   _grad_scale=lambda self: 1.0)
WrongCount = _seam("WrongCount", "Mean over the wrong count: divides by world_size + 1 (off by one).",
                   _grad_scale=lambda self: 1.0 / (self.collectives.world_size + 1))
ScaleTwice = _seam("ScaleTwice", "The 1/world_size scale is applied twice (1/world_size**2).",
                   _grad_scale=lambda self: 1.0 / self.collectives.world_size ** 2)
NoInitialBroadcast = _seam("NoInitialBroadcast", "Module states are not broadcast at construction (replicas "
                           "start apart).", _sync_module_states=lambda self: None)
BuffersNotBroadcast = _seam("BuffersNotBroadcast", "``broadcast_buffers=True`` is accepted but buffers are never "
                            "broadcast.", _sync_buffers=lambda self: None)
NoSyncIgnored = _seam("NoSyncIgnored", "``no_sync()`` is a no-op: gradients are all-reduced every micro-step.",
                      no_sync=lambda self: contextlib.nullcontext())


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


# --- the loop around the DDP (docs/scenarios.md, "The loop programs") ---------------------------

class ReduceOnlyInTraining(RefDDP):
    """Gradients are averaged only while the module is in train mode: a backward in eval mode
    (fine-tuning with frozen statistics) leaves every replica with its local gradient."""

    def _on_grad_ready(self, param):
        if self.module.training:
            super()._on_grad_ready(param)

    def _queue_finalize(self):
        if self.module.training:
            super()._queue_finalize()


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


class FrozenNotBroadcast(RefDDP):
    """The construction broadcast sends the parameters that require grad only (the list the DDP
    reduces): a parameter frozen before wrapping (a fine-tuned backbone) keeps each replica's own
    value (torch broadcasts every parameter, ``_sync_module_states`` over ``named_parameters()``)."""

    def _sync_module_states(self) -> None:
        frozen = [p for p in self.module.parameters() if not p.requires_grad]
        own = [p.detach().clone() for p in frozen]
        super()._sync_module_states()
        with torch.no_grad():
            for p, o in zip(frozen, own):
                p.copy_(o)


class ForwardSyncNeedsTrainable(RefDDP):
    """A grad-enabled forward arms the next buffer broadcast only if some parameter requires grad:
    a model frozen for one forward (a GAN's discriminator during the generator step) does not
    (torch reads grad mode and ``no_sync`` only)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if not any(p.requires_grad for p in self.module.parameters()):
            self.require_forward_param_sync = False
        return out


class EvalBuffersSyncedAfterForward(RefDDP):
    """An eval-mode forward without grad (validation) broadcasts rank 0's buffers after the module
    ran instead of before: the buffers end as torch's (eval mode leaves them alone), but each
    replica's output was computed from its own running statistics."""

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() or self.module.training:
            return super().forward(*args, **kwargs)
        sync = self.broadcast_buffers and self.require_forward_param_sync
        self.require_forward_param_sync = False
        out = super().forward(*args, **kwargs)
        if sync:
            self._sync_buffers()
        return out


class NoGradForwardDisarms(RefDDP):
    """Every forward decides whether the next backward reduces, a forward without grad deciding
    it does not: a no_grad target forward between a training forward and its backward
    (pseudo-labels, a mean teacher sharing the model) leaves that backward local (torch arms the
    reducer in grad-enabled forwards only and leaves it armed across others)."""

    _disarmed = False

    def forward(self, *args, **kwargs):
        self._disarmed = not torch.is_grad_enabled()
        return super().forward(*args, **kwargs)

    def _queue_finalize(self) -> None:
        if not self._disarmed:
            super()._queue_finalize()

    def _on_grad_ready(self, param) -> None:
        if not self._disarmed:
            super()._on_grad_ready(param)


class StateDictCollective(RefDDP):
    """``state_dict()`` checks that the replicas agree (an all-reduce of a checksum), so it is a
    collective: saved on rank 0 only (``if rank == 0: torch.save(model.state_dict(), path)``), it
    pairs with the other replicas' next collective (wrong values or a hang)."""

    def state_dict(self, *args, **kwargs):
        sd = super().state_dict(*args, **kwargs)
        with torch.no_grad():
            check = sum((v.detach().double().sum() for v in sd.values()
                         if torch.is_tensor(v) and v.is_floating_point()), torch.zeros((), dtype=torch.float64))
            self.collectives.all_reduce_(check.reshape(1).to(next(iter(sd.values())).device))
        return sd


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


class RewrapReusesHooks(RefDDP):
    """A module wrapped again keeps the parameter list its first wrapper reduced (hooks registered
    once per module): parameters unfrozen between the wraps are never all-reduced, the replicas
    train them apart."""

    _first = weakref.WeakKeyDictionary()  # module -> ids of the parameters its first wrapper reduces

    def __init__(self, module, **kw):
        first = RewrapReusesHooks._first.setdefault(module, {id(p) for p in module.parameters() if p.requires_grad})
        later = [p for p in module.parameters() if p.requires_grad and id(p) not in first]
        for p in later:
            p.requires_grad_(False)
        try:
            super().__init__(module, **kw)
        finally:
            for p in later:
                p.requires_grad_(True)


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


class LoadAssigns(RefDDP):
    """``load_state_dict`` swaps in the checkpoint's tensors (``assign=True``) instead of
    copying into the live parameters: the optimizer keeps updating the old ones."""

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return super().load_state_dict(state_dict, strict=strict, assign=True)


class SyncBNLocalStats(RefDDP):
    """Converts BatchNorm to SyncBatchNorm but normalises with local statistics."""


class LocalStatsBN(SyncBatchNorm):
    """The SyncBatchNorm :class:`SyncBNLocalStats` converts to: local statistics."""

    def forward(self, x):  # local statistics, local backward: plain BatchNorm
        return torch.nn.BatchNorm1d.forward(self, x)


def shard_zero(ctx):
    """The shard every replica of ``shard_mixup`` trains on (``Strategy.shard_rank``): 0."""
    return 0


# --- process groups --------------------------------------------------------------------------

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
