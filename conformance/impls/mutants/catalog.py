"""The mutant catalog: deliberately broken DDPs every check table must kill, one row each.

A mutant is the reference DDP with one seam broken (:mod:`~conformance.impls.mutants.refmutants`,
:mod:`~conformance.impls.mutants.workloadmutants`), torch's DDP or one of PyTorch's shipped paths
with one fault (:mod:`~conformance.impls.mutants.torchmutants`), a compact from-scratch DDP with
one fault (:mod:`~conformance.impls.mutants.scratch`), or a correct DDP fed the wrong shard.
Operators follow real data-parallel bugs (cf. DeepCrime's catalogue of DL faults). Which cases
must kill a mutant is stated only in the case table's ``must_kill`` column, whose validation
checks that every mutant here is named by some case.

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
M = "conformance.impls.mutants.structuremutants:"


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


def _class(module: str, name: str) -> str:
    """The class of mutant ``name`` in ``module``, by reference: the name in CamelCase
    (``no_grad_sync``: ``NoGradSync``)."""
    return module + "".join(word.capitalize() for word in name.split("_"))


def _ref(module: str, *names) -> list[Mutant]:
    """Mutants on the reference DDP (:mod:`~conformance.impls.mutants.refmutants`, ``R``, or
    :mod:`~conformance.impls.mutants.workloadmutants`, ``W``), each its class's docstring."""
    return [Mutant(n, _class(module, n)) for n in names]


def _torch(name, doc, **claims):
    """A mutant on torch's DDP (:mod:`~conformance.impls.mutants.torchmutants`)."""
    return Mutant(name, _class(T, name), doc, torch_based=True, **claims)


def _scratch(*names, cls=None) -> list[Mutant]:
    """Mutants on the from-scratch DDP (:mod:`~conformance.impls.mutants.scratch`)."""
    return [Mutant(n, S + cls if cls else _class(S, n), torch_based=True, unsupported={"pjrt": SCRATCH_ON_PJRT})
            for n in names]


def _shipped(name, doc):
    """A shipped path's row with one fault: the factory ``name`` of
    :mod:`~conformance.impls.mutants.torchmutants`."""
    return Mutant(name, None, doc, shipped_path=T + name)


MUTANTS = {m.name: m for m in [
    *_ref(R, "no_grad_sync", "sum_not_mean", "wrong_count", "no_initial_broadcast", "buffers_not_broadcast",
          "last_param_unsynced", "scale_twice", "stale_gradient"),
    Mutant("shard_mixup", "ddp_impl:DistributedDataParallel", "Correct DDP, but every replica trains on "
           "shard 0 (rank binding returns 0).", shard_rank=R + "shard_zero"),
    *_ref(R, "clip_local_grad", "buffers_always_broadcast", "unused_zero_filled", "unused_skipped"),
    # The loop around the DDP (docs/scenarios.md, "The loop programs").
    *_ref(R, "reduce_only_in_training", "eval_forward_skips_buffer_sync", "buffer_sync_ignores_grad_mode",
          "buffer_sync_once_per_iteration", "forward_sync_flag_shared", "forward_sync_flag_cleared_first",
          "synced_forward_zeroes_grads", "unused_by_this_backward_dropped", "mean_at_optimizer_step",
          "frozen_not_broadcast", "forward_sync_needs_trainable", "eval_buffers_synced_after_forward",
          "no_grad_forward_disarms", "rewrap_reuses_hooks"),
    Mutant("state_dict_collective", R + "StateDictCollective", unsupported={"pjrt": (
        "its rank-0-only all-reduce feeds nothing: a lazy XLA graph drops it, so the fault never reaches a "
        "PJRT step")}),
    *_ref(R, "no_sync_ignored", "no_sync_sticky", "dropped_bucket", "exact_full_bucket_dropped",
          "static_graph_stale", "unfreezes_params", "unties_shared_weights", "state_dict_drops_buffers",
          "load_assigns", "reduce_at_first_firing", "finalize_at_first_firing"),
    _torch("comm_hook_no_divide", "torch DDP whose registered comm hook all-reduces but forgets to divide."),
    _torch("comm_hook_value_ignored", "torch DDP that ignores the comm hook's future value and reads the bucket "
           "buffer back (assumes an in-place hook such as allreduce_hook): a hook returning a new tensor leaves "
           "every replica with its local gradient."),
    _torch("join_dropped", "torch DDP whose join() does nothing: the replica with more batches hangs in an "
           "all-reduce."),
    # torch 2.13's keywords (scenario.keywords), on torch's own DDP.
    _torch("forward_sync_off_skips_init", "torch DDP that reads forward_sync_buffers=False as "
           "broadcast_buffers=False: the construction sync of buffers is skipped too.",
           unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    _torch("init_sync_ignored", "torch DDP that accepts init_sync=False and syncs parameters and buffers at "
           "construction anyway.", unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    _torch("last_listed_bucket_unreduced", "torch DDP that, given bucket_cap_mb_list, never reduces its last "
           "bucket.", unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    _torch("batched_copy_undivided", "torch DDP whose batched_grad_copy=True path sums gradients instead of "
           "averaging them.", unsupported={"pjrt": KEYWORDS_ON_PJRT}),
    Mutant("sync_bn_local_stats", R + "SyncBNLocalStats", sync_bn=R + "LocalStatsBN"),
    # Scenario kinds, on a from-scratch DDP (conformance/impls/mutants/scratch.py).
    *_scratch("unused_accum_dropped", "arrival_order_pairing", "cached_buffer_list", "replica_drift",
              "late_desync", "batch_weighted"),
    *_scratch("fp16_allreduce", cls="Fp16AllReduce"),
    *_scratch("param_swap", "rng_sync", "rng_consume", "train_mode_at_wrap", "unfreeze_at_wrap",
              "state_dict_unprefixed", "output_flattened", "user_hook_bypassed", "params_relaid",
              "default_dtype_leak"),
    # Process-wide state left for the next implementation (conformance/worlds/isolation.py).
    *_scratch("all_reduce_wrapped", "launcher_env_set", "global_hook_left"),
    # PyTorch's shipped paths (conformance/impls/torch_paths.py), one fault each.
    _shipped("fsdp2_no_divide", "fully_shard with set_gradient_divide_factor(1.0): the gradient reduce-scatter "
             "sums instead of averaging (W x the gradient; a divide factor set for a pre-scaled loss or another "
             "world size)."),
    _shipped("fsdp2_wrong_mesh", "fully_shard on the size-1 'tp' dim of a (dp, tp) = (W, 1) mesh instead of "
             "'dp': gradients are reduced over a group of one, each replica trains on its own shard (the "
             "wrong-mesh-dim bug of 2-D parallel setups)."),
    _shipped("zero_no_param_sync", "ZeroRedundancyOptimizer whose step() skips the post-step broadcast of "
             "parameter shards (_sync_params): each replica updates only the shard it owns, so parameters "
             "diverge (ZeRO's lost all-gather of updated shards)."),
    _shipped("torch_compile_eager", "torch.compile(DDP(m)) over a bare torch.nn root: dynamo compiles no graph "
             "and every step runs eagerly (pytorch#140416, docs/findings.md 2); the row's no-graph guard must "
             "refuse it rather than pass eager DDP as compiled."),
    *_ref(R, "group_sum_global_divide", "broadcast_global_rank0"),
    # Workload corners (fixtures/models.py; docs/scenarios.md "The workload axis").
    *_ref(W, "sparse_grad_unsynced", "strided_unpack", "complex_real_bucket", "fp32_fusion_buffer"),
    # The module axis (docs/scenarios.md, "The module axis").
    *_ref(W, "output_walk_bare_tensor", "sink_misses_structured_output", "state_dict_buffers_only",
          "forward_hooks_skipped", "container_params_unsynced", "parametrized_layer_sync", "forward_kwargs_dropped",
          "float_buffers_only"),
    # A model's structural kinds (docs/topologies.md, "Structural kinds").
    *_ref(M, "parent_params_unsynced", "deep_buffers_unsynced", "uncalled_owner_unsynced", "none_slot_stops_walk",
          "none_positional_dropped", "oversize_grad_truncated"),
]}


def unknown_mutant(name: str) -> str:
    """The one line for ``mutant:<name>`` naming no row of :data:`MUTANTS`."""
    return f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}"
