"""The mutant catalog: deliberately broken DDPs every check table must kill.

Each mutant is the reference DDP (:class:`ddp_impl.DistributedDataParallel`) with one seam
broken (:mod:`~conformance.impls.mutants.refmutants`,
:mod:`~conformance.impls.mutants.workloadmutants`), a torch DDP with one method broken or one of
PyTorch's shipped data-parallel paths (the rows of ``conformance/impls/torch_paths.py``: FSDP2,
ZeRO, torch.compile) with one fault (:mod:`~conformance.impls.mutants.torchmutants`), a compact
from-scratch DDP with one fault (:mod:`~conformance.impls.mutants.scratch`), or a correct DDP fed
the wrong shard. Operators follow real data-parallel bugs (cf. DeepCrime's catalogue of DL
faults). Which cases must kill a mutant is stated in one place only: the ``must_kill`` column of
the case table (``conformance/cases/table.py``), whose validation checks that every mutant here
is named by some case.

Data only: a row names its code by reference (``"module:attr"``, resolved on first use by
:func:`conformance.cases.row.resolve`), so the catalog loads without torch and the CLI checks
``--ddp mutant:<name>`` against it before torch is imported.
"""
from __future__ import annotations

from dataclasses import dataclass

from conformance.cases.row import resolve

SCRATCH_ON_PJRT = ("written on torch.distributed (gloo collectives); the PJRT world has no "
                   "process-per-replica torch.distributed group")
KEYWORDS_ON_PJRT = ("torch 2.13's DDP keywords (init_sync=False, forward_sync_buffers, bucket_cap_mb_list, "
                    "batched_grad_copy): torch_xla pins an older torch")

R = "conformance.impls.mutants.refmutants:"
W = "conformance.impls.mutants.workloadmutants:"
T = "conformance.impls.mutants.torchmutants:"
S = "conformance.impls.mutants.scratch:"


@dataclass(frozen=True)
class Mutant:
    """One catalog row. ``ddp_class``: the mutant's DDP class, by reference; ``torch_based``
    ones are constructed without the replica's collectives; ``doc``: its description (``None``:
    the class's docstring, :attr:`description`); ``shard_rank``: the replica's shard
    (``Strategy.shard_rank``), by reference; ``sync_bn``: the SyncBatchNorm class the mutant
    converts BatchNorm layers to, by reference; ``honours`` lists torch DDP keywords the mutant
    implements although the reference ignores them (so cases requiring them run);
    ``shipped_path``: a zero-argument factory of a shipped path's row
    (``conformance.impls.torch_paths``) with the fault built in, by reference, used instead of
    ``ddp_class``. A reference is ``"module:attr"`` (or the object itself)."""

    name: str
    ddp_class: object
    doc: str | None = None
    shard_rank: object = None
    torch_based: bool = False
    sync_bn: object = None
    honours: tuple = ()
    unsupported: dict | None = None
    shipped_path: object = None

    @property
    def description(self) -> str:
        """What the mutant breaks: :attr:`doc`, else its class's docstring (imports the class)."""
        return self.doc if self.doc is not None else resolve(self.ddp_class).__doc__


def _torch(name, cls, doc, **claims):
    """A mutant on torch's DDP (:mod:`~conformance.impls.mutants.torchmutants`)."""
    return Mutant(name, T + cls, doc, torch_based=True, **claims)


def _scratch(name, cls):
    """A mutant on the from-scratch DDP (:mod:`~conformance.impls.mutants.scratch`)."""
    return Mutant(name, S + cls, torch_based=True, unsupported={"pjrt": SCRATCH_ON_PJRT})


def _shipped(name, factory, doc):
    """A shipped path's row with one fault (:mod:`~conformance.impls.mutants.torchmutants`)."""
    return Mutant(name, None, doc, shipped_path=T + factory)


MUTANTS = {m.name: m for m in [
    Mutant("no_grad_sync", R + "NoGradSync"),
    Mutant("sum_not_mean", R + "SumNotMean"),
    Mutant("wrong_count", R + "WrongCount"),
    Mutant("no_initial_broadcast", R + "NoInitialBroadcast"),
    Mutant("buffers_not_broadcast", R + "BuffersNotBroadcast"),
    Mutant("last_param_unsynced", R + "LastParamUnsynced"),
    Mutant("scale_twice", R + "ScaleTwice"),
    Mutant("stale_gradient", R + "StaleGradient"),
    Mutant("shard_mixup", "ddp_impl:DistributedDataParallel", "Correct DDP, but every replica trains on "
           "shard 0 (rank binding returns 0).", shard_rank=R + "shard_zero"),
    Mutant("clip_local_grad", R + "ClipLocalGrad"),
    Mutant("buffers_always_broadcast", R + "BuffersAlwaysBroadcast"),
    Mutant("unused_zero_filled", R + "UnusedZeroFilled"),
    Mutant("unused_skipped", R + "UnusedSkipped"),
    # The loop around the DDP (docs/scenarios.md, "The loop programs").
    Mutant("reduce_only_in_training", R + "ReduceOnlyInTraining"),
    Mutant("eval_forward_skips_buffer_sync", R + "EvalForwardSkipsBufferSync"),
    Mutant("buffer_sync_ignores_grad_mode", R + "BufferSyncIgnoresGradMode"),
    Mutant("buffer_sync_once_per_iteration", R + "BufferSyncOncePerIteration"),
    Mutant("forward_sync_flag_shared", R + "ForwardSyncFlagShared"),
    Mutant("forward_sync_flag_cleared_first", R + "ForwardSyncFlagClearedFirst"),
    Mutant("synced_forward_zeroes_grads", R + "SyncedForwardZeroesGrads"),
    Mutant("unused_by_this_backward_dropped", R + "UnusedByThisBackwardDropped"),
    Mutant("mean_at_optimizer_step", R + "MeanAtOptimizerStep"),
    Mutant("no_sync_ignored", R + "NoSyncIgnored"),
    Mutant("no_sync_sticky", R + "NoSyncSticky"),
    Mutant("dropped_bucket", R + "DroppedBucket"),
    Mutant("exact_full_bucket_dropped", R + "ExactFullBucketDropped"),
    Mutant("static_graph_stale", R + "StaticGraphStale"),
    Mutant("unfreezes_params", R + "UnfreezesParams"),
    Mutant("unties_shared_weights", R + "UntiesSharedWeights"),
    Mutant("state_dict_drops_buffers", R + "StateDictDropsBuffers"),
    Mutant("load_assigns", R + "LoadAssigns"),
    Mutant("reduce_at_first_firing", R + "ReduceAtFirstFiring"),
    Mutant("finalize_at_first_firing", R + "FinalizeAtFirstFiring"),
    _torch("comm_hook_no_divide", "CommHookNoDivide", "torch DDP whose registered comm hook all-reduces "
           "but forgets to divide."),
    _torch("comm_hook_value_ignored", "CommHookValueIgnored", "torch DDP that ignores the comm hook's future "
           "value and reads the bucket buffer back (assumes an in-place hook such as allreduce_hook): a hook "
           "returning a new tensor leaves every replica with its local gradient."),
    _torch("join_dropped", "JoinDropped", "torch DDP whose join() does nothing: the replica with more "
           "batches hangs in an all-reduce."),
    # torch 2.13's keywords (scenario.keywords), on torch's own DDP.
    _torch("forward_sync_off_skips_init", "ForwardSyncOffSkipsInit", "torch DDP that reads "
           "forward_sync_buffers=False as broadcast_buffers=False: the construction sync of buffers is "
           "skipped too.", unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    _torch("init_sync_ignored", "InitSyncIgnored", "torch DDP that accepts init_sync=False and syncs "
           "parameters and buffers at construction anyway.", unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    _torch("last_listed_bucket_unreduced", "LastListedBucketUnreduced", "torch DDP that, given "
           "bucket_cap_mb_list, never reduces its last bucket.", unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    _torch("batched_copy_undivided", "BatchedCopyUndivided", "torch DDP whose batched_grad_copy=True path "
           "sums gradients instead of averaging them.", unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    Mutant("sync_bn_local_stats", R + "SyncBNLocalStats", sync_bn=R + "LocalStatsBN"),
    # Scenario kinds, on a from-scratch DDP (conformance/impls/mutants/scratch.py).
    _scratch("unused_accum_dropped", "UnusedAccumDropped"),
    _scratch("arrival_order_pairing", "ArrivalOrderPairing"),
    _scratch("cached_buffer_list", "CachedBufferList"),
    _scratch("replica_drift", "ReplicaDrift"),
    _scratch("late_desync", "LateDesync"),
    _scratch("batch_weighted", "BatchWeighted"),
    _scratch("fp16_allreduce", "Fp16AllReduce"),
    _scratch("param_swap", "ParamSwap"),
    _scratch("rng_sync", "RngSync"),
    _scratch("rng_consume", "RngConsume"),
    _scratch("train_mode_at_wrap", "TrainModeAtWrap"),
    _scratch("unfreeze_at_wrap", "UnfreezeAtWrap"),
    _scratch("state_dict_unprefixed", "StateDictUnprefixed"),
    _scratch("output_flattened", "OutputFlattened"),
    _scratch("user_hook_bypassed", "UserHookBypassed"),
    _scratch("params_relaid", "ParamsRelaid"),
    _scratch("default_dtype_leak", "DefaultDtypeLeak"),
    # PyTorch's shipped paths (conformance/impls/torch_paths.py), one fault each.
    _shipped("fsdp2_no_divide", "fsdp2_no_divide", "fully_shard with set_gradient_divide_factor(1.0): the "
             "gradient reduce-scatter sums instead of averaging (W x the gradient; a divide factor set for a "
             "pre-scaled loss or another world size)."),
    _shipped("fsdp2_wrong_mesh", "fsdp2_wrong_mesh", "fully_shard on the size-1 'tp' dim of a (dp, tp) = "
             "(W, 1) mesh instead of 'dp': gradients are reduced over a group of one, each replica trains on "
             "its own shard (the wrong-mesh-dim bug of 2-D parallel setups)."),
    _shipped("zero_no_param_sync", "zero_no_param_sync", "ZeroRedundancyOptimizer whose step() skips the "
             "post-step broadcast of parameter shards (_sync_params): each replica updates only the shard it "
             "owns, so parameters diverge (ZeRO's lost all-gather of updated shards)."),
    _shipped("torch_compile_eager", "torch_compile_eager", "torch.compile(DDP(m)) over a bare torch.nn root: "
             "dynamo compiles no graph and every step runs eagerly (pytorch#140416, docs/findings.md 2); the "
             "row's no-graph guard must refuse it rather than pass eager DDP as compiled."),
    Mutant("group_sum_global_divide", R + "GroupSumGlobalDivide"),
    Mutant("broadcast_global_rank0", R + "BroadcastGlobalRank0"),
    # Workload corners (fixtures/models.py; docs/scenarios.md "The workload axis").
    Mutant("sparse_grad_unsynced", W + "SparseGradUnsynced"),
    Mutant("strided_unpack", W + "StridedUnpack"),
    Mutant("complex_real_bucket", W + "ComplexRealBucket"),
    Mutant("fp32_fusion_buffer", W + "Fp32FusionBuffer"),
    # The module axis (docs/scenarios.md, "The module axis").
    Mutant("output_walk_bare_tensor", W + "OutputWalkBareTensor"),
    Mutant("state_dict_buffers_only", W + "StateDictBuffersOnly"),
    Mutant("forward_hooks_skipped", W + "ForwardHooksSkipped"),
    Mutant("container_params_unsynced", W + "ContainerParamsUnsynced"),
    Mutant("parametrized_layer_sync", W + "ParametrizedLayerSync"),
    Mutant("forward_kwargs_dropped", W + "ForwardKwargsDropped"),
    Mutant("float_buffers_only", W + "FloatBuffersOnly"),
]}


def unknown_mutant(name: str) -> str:
    """The one line for ``mutant:<name>`` naming no row of :data:`MUTANTS`."""
    return f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}"
