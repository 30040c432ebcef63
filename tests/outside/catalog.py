"""Catalog of the outside DDPs: one correct, the rest each with one fault (a data table).

Columns of ``Entry``:
  name       short id (used by ``catch_rate.py --only`` and as the pytest id)
  spec       ``module:Class`` under ``tests.outside`` (what ``--ddp`` receives)
  letter     the fault's letter in the brief ('' for the correct DDP)
  kind       the fault, in DDP terms ('' for the correct DDP)
  dimension  the run dimension that should expose it (feature, model, world size, steps...)
  source     the public bug report / discussion it is modelled on
  main_caught  measured on the current kit: does ``python -m conformance run --runtime cpu
             --ddp <spec>`` exit 1? ``None`` for the correct DDP (expected exit 0). Entries with
             False are xfail(strict=True) in tests/test_outside.py. Baseline before the case
             table and the scenarios: 1/16; measured since: 16/16 (docs in the issue notes).
             Sharded-reduction rows (ShardedCorrectDDP and q-v, reduce-scatter + all-gather
             DDPs): 5/6 caught at W = 2; sharded_predivide_int is bit-exact at W = 2 and 4, so
             the main command's default world sizes became 2,3: 6/6 since (predivide: 39 fails,
             all at W = 3); sharded_floor_tail is caught at W = 2 by the property family only,
             at W = 3 by parity too.
             2026-12-01, one ``run --exitfirst-each`` over the whole catalog (default world
             sizes, CI profile): 22/22 faulty caught, both correct DDPs pass; where each
             stopped is ``CAUGHT_BY`` below.
             2026-12-01, process-group rows (x, y; the main command per entry, default world
             sizes with feature.subgroups at 3 and 4): exit 1 each, 144 pass, 4 fail (only
             feature.subgroups param and loss parity at W=3 and 4), 8 unsupported.
  pytest_caught  the same for the pytest face (``catch_rate.py --face pytest``: the parity,
             feature and property modules with ``--ddp <spec> -m cpu -k 'not mutant'``).
             hook_order_pairing is caught there by the unused-parameters feature, whose
             replicas use different parameter sets (so their hook arrival orders differ).

Expected outcome: CorrectDDP passes (exit 0); every faulty entry should fail (exit 1).
"""

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Entry:
    name: str
    spec: str
    letter: str
    kind: str
    dimension: str
    source: str
    main_caught: Optional[bool]
    pytest_caught: Optional[bool] = None

    @property
    def faulty(self) -> bool:
        return bool(self.kind)

    @property
    def ddp(self) -> str:
        """The ``--ddp`` argument: ``tests.outside.<module>:<Class>``."""
        return f"tests.outside.{self.spec}"


PKG = "tests.outside"

CATALOG = [
    Entry("correct", "correct_ddp:CorrectDDP", "", "", "every check: must pass",
          "https://pytorch.org/docs/stable/notes/ddp.html", None),
    Entry("accum_wrong_average", "accum_wrong_average:AccumWrongAverageDDP", "a",
          "divides the accumulated gradient by micro-steps x world size",
          "no_sync / gradient accumulation",
          "https://github.com/karpathy/build-nanogpt/pull/30", True, True),
    Entry("comm_hook_double_divide", "comm_hook_double_divide:CommHookDoubleDivideDDP", "b",
          "divides a comm hook's (already averaged) result by the world size again",
          "register_comm_hook (allreduce_hook)",
          "https://github.com/pytorch/pytorch/pull/42400", True, True),
    Entry("tied_weights_twice", "tied_weights_twice:TiedWeightsTwiceDDP", "c",
          "a shared parameter is reduced per occurrence: gradient 2x the mean",
          "model with tied weights",
          "https://github.com/pytorch/pytorch/pull/51929", True, True),
    Entry("static_graph_first_iter", "static_graph_first_iter:StaticGraphFirstIterDDP", "d",
          "static_graph=True: first iteration not all-reduced",
          "static_graph=True, step 1",
          "https://github.com/Lightning-AI/pytorch-lightning/issues/18086", True, True),
    Entry("bucket_view_stale", "bucket_view_stale:BucketViewStaleDDP", "e",
          "gradient_as_bucket_view=True: reduced bucket not refreshed, stale grads from step 2",
          "gradient_as_bucket_view=True, >= 2 steps with zero_grad(set_to_none)",
          "https://github.com/pytorch/xla/issues/8841", True, True),
    Entry("buffers_wrong_rank", "buffers_wrong_rank:BuffersWrongRankDDP", "f",
          "per-forward buffer broadcast from the last rank instead of rank 0",
          "buffer parity, model with buffers (batchnorm), broadcast_buffers on",
          "https://github.com/pytorch/pytorch/issues/63916", True, True),
    Entry("no_sync_sticky", "no_sync_sticky:NoSyncStickyDDP", "g",
          "no_sync also disables the next (synchronising) backward",
          "no_sync accumulation window",
          "https://github.com/facebookresearch/ClassyVision/pull/706", True, True),
    Entry("unused_zero_filled", "unused_zero_filled:UnusedZeroFilledDDP", "h",
          "globally unused parameters get a zero gradient instead of None",
          "find_unused_parameters=True with a globally unused parameter",
          "https://github.com/pytorch/pytorch/pull/28883", True, True),
    Entry("checkpoint_assign", "checkpoint_assign:CheckpointAssignDDP", "i",
          "load_state_dict swaps parameter tensors: optimizer and hooks left on stale tensors",
          "checkpoint save/reload into the same DDP, training continues",
          "https://github.com/pytorch/pytorch/pull/53224", True, False),
    Entry("join_drops_grads", "join_drops_grads:JoinDropsGradsDDP", "j",
          "join(): replicas still training drop their reduced gradients",
          "join() with uneven numbers of batches",
          "https://github.com/pytorch/pytorch/pull/42577", True, True),
    Entry("unused_in_accumulation", "unused_in_accumulation:UnusedInAccumulationDDP", "k",
          "used-parameter map reset each micro-step: accumulated grad of a parameter unused in "
          "the synced micro-step never averaged",
          "find_unused_parameters x no_sync, used set changing between micro-steps",
          "https://github.com/pytorch/pytorch/issues/69031", True, False),
    Entry("hook_order_pairing", "hook_order_pairing:HookOrderPairingDDP", "l",
          "gradients packed in hook arrival order: mismatched pairing under rank-dependent "
          "control flow",
          "model with rank-dependent control flow",
          "https://github.com/deepspeedai/DeepSpeed/issues/1186", True, True),
    Entry("cached_buffers", "cached_buffers:CachedBuffersDDP", "m",
          "buffer list cached at construction: a buffer rebound in forward is not broadcast",
          "buffer parity, model that rebinds a buffer in forward",
          "https://github.com/pytorch/pytorch/issues/63916", True, False),
    Entry("replica_drift", "replica_drift:ReplicaDriftDDP", "n",
          "replica r scales its synced gradient by (1 + 1e-6 r) from step 2 on",
          "replica agreement (every replica vs replica 0), tight tolerance",
          "https://github.com/pytorch/pytorch/issues/112152", True, False),
    Entry("late_fault", "late_fault:LateFaultDDP", "o",
          "synchronisation lost from synced step 41 on",
          "run length >= 41 steps",
          "https://github.com/pytorch/pytorch/pull/72843", True, False),
    Entry("batch_weighted", "batch_weighted:BatchWeightedDDP", "p",
          "replica gradients weighted by local batch size instead of an equal average",
          "uneven local batch sizes",
          "https://github.com/pytorch/pytorch/issues/37359", True, False),
    Entry("sharded_correct", "sharded_correct:ShardedCorrectDDP", "", "",
          "every check: must pass (gradients reduced by reduce-scatter + all-gather)",
          "https://pytorch.org/docs/stable/fsdp.html", None),
    Entry("sharded_floor_tail", "sharded_floor_tail:ShardedFloorTailDDP", "q",
          "shard length numel // W: the last numel % W elements of a bucket are never reduced "
          "(local gradient kept)",
          "bucket numel not divisible by the world size (odd shapes at W=2, most models at W=3)",
          "https://github.com/NVIDIA/Megatron-LM/issues/561", True),
    Entry("sharded_own_shard_scale", "sharded_own_shard_scale:ShardedOwnShardScaleDDP", "r",
          "1/W applied only to the rank's own shard: the other shards are all-gathered unscaled",
          "any parity check (scale-sensitive optimizer), replica agreement",
          "constructed", True),
    Entry("sharded_gather_order", "sharded_gather_order:ShardedGatherOrderDDP", "s",
          "all-gathered shards placed in the wrong rank order (rank r's shard at (r+1) % W)",
          "parameter parity (replicas agree with each other)",
          "https://github.com/pytorch/xla/issues/3824", True),
    Entry("sharded_partition_accumulates",
          "sharded_partition_accumulates:ShardedPartitionAccumulatesDDP", "t",
          "owned gradient partition accumulates across optimizer steps (cleared only by the "
          "wrapper's zero_grad, not optimizer.zero_grad)",
          ">= 2 optimizer steps",
          "https://github.com/deepspeedai/DeepSpeed/pull/856", True),
    Entry("sharded_predivide_int", "sharded_predivide_int:ShardedPredivideIntDDP", "u",
          "pre-divide by a power of two f, post-divide by W // f: mean divided by 2 at W=3",
          "world size not a power of two (W=3); bit-exact at W=2 and W=4",
          "https://github.com/pytorch/pytorch/pull/80456", True),
    Entry("sharded_unused_not_written", "sharded_unused_not_written:ShardedUnusedNotWrittenDDP",
          "v",
          "gathered mean written only into locally existing grads: a parameter unused here but "
          "used elsewhere keeps None on this replica",
          "find_unused_parameters with rank-dependent parameter use",
          "https://github.com/deepspeedai/DeepSpeed/issues/777", True),
    Entry("local_world_divisor", "local_world_divisor:LocalWorldDDP", "w",
          "all-reduce sum divided by LOCAL_WORLD_SIZE instead of the world size",
          "hosts: exact on one host, wrong on the emulated 2-host W=2 world",
          "https://github.com/pytorch/xla/pull/4965", True),
    Entry("group_global_divide", "group_global_divide:GroupGlobalDivideDDP", "x",
          "with a process_group: all-reduce sum over the group divided by the global world size",
          "process subgroups (feature.subgroups: groups of two at W=3 and 4)",
          "https://github.com/pytorch/pytorch/issues/36516", True),
    Entry("group_broadcast_rank0", "group_broadcast_rank0:GroupBroadcastRank0DDP", "y",
          "with a process_group: module states broadcast from global rank 0 over the default "
          "group, not from the group's first rank",
          "process subgroups (feature.subgroups: a group without global rank 0)",
          "https://github.com/meta-pytorch/torchrec/pull/4601", True),
    # Issue 18 (graph shape, comm hooks returning a new tensor): 2026-12-01, ``run --runtime cpu
    # --ddp <both> --exitfirst-each`` (default world sizes): exit 1, each stopped at W=2.
    Entry("first_firing_snapshot", "first_firing_snapshot:FirstFiringSnapshotDDP", "18.5",
          "a gradient is taken into its bucket at its hook's first firing; a second firing in the "
          "same backward (reentrant checkpoint) is dropped",
          "graph shape: a module applied twice under reentrant activation checkpointing",
          "https://github.com/pytorch/pytorch/issues/84589", True),
    Entry("comm_hook_reads_buffer", "comm_hook_reads_buffer:CommHookReadsBufferDDP", "18.7",
          "ignores a comm hook's future value and reads the bucket buffer back (assumes an "
          "in-place hook)",
          "register_comm_hook with a hook that returns a new tensor",
          "https://github.com/pytorch/pytorch/issues/75031", True),
    # Workload corners (issue 18: gradient kind, layout, dtype); main_caught measured 2026-12-01.
    Entry("sparse_grads_unsynced", "sparse_grads_unsynced:SparseGradsUnsyncedDDP", "18.1",
          "sparse gradients (Embedding(sparse=True)) left out of the reduction",
          "sparse-gradient corner (parity.sparse_embedding)",
          "https://github.com/pytorch/pytorch/issues/22037", True),
    Entry("strided_unpack", "strided_unpack:StridedUnpackDDP", "18.2",
          "gradients packed in logical order, unpacked through the parameter's strides",
          "layout corner: channels_last and transposed parameters (parity.channels_last)",
          "https://github.com/pytorch/pytorch/pull/47163", True),
    Entry("complex_real_bucket", "complex_real_bucket:ComplexRealBucketDDP", "18.3",
          "complex gradients copied into a real bucket: imaginary part lost",
          "complex dtype corner (parity.complex64)",
          "https://github.com/pytorch/pytorch/issues/158753", True),
    Entry("fp32_fusion_buffer", "fp32_fusion_buffer:Fp32FusionBufferDDP", "18.4",
          "one float32 fusion buffer: float64 gradients reduced at float32 precision",
          "float64 dtype corner (parity.float64)",
          "https://github.com/pytorch/PiPPy/issues/656", True),
    # Issue 18, the drawn workload (a corner combination no fixed row hits): measured 2026-12-01,
    # ``run --runtime cpu --ddp <spec>``: exit 1; scenario.workload fails at W=2 and 3 (params,
    # buffers, optimizer_state, naming 'emb.weight' (sparse gradient) and the no_sync window),
    # parity.sparse_embedding passes (one backward per step).
    Entry("sparse_last_micro_step", "sparse_last_micro_step:SparseLastMicroStepDDP", "18.w",
          "a sparse gradient is reduced from the synced backward alone: micro-steps accumulated "
          "under no_sync are lost for it (dense gradients are right)",
          "workload corner: sparse gradient x accumulation window (scenario.workload)",
          "https://github.com/NVIDIA/recsys-examples/issues/393", True),
    # Issue 25, the user's training loop and module (measured 2026-12-02, the main command per
    # entry, default world sizes 2 and 3). The loop faults (25.1-25.5) are caught by
    # scenario.loop only, except 25.5, whose lazy write-back is also seen by every check that
    # reads .grad after backward, and 25.5b, caught first by scenario.core's loss-scale unscaling
    # (an edit of .grad before the step, like clipping); the module faults (25.6-25.8) by the
    # module-axis parity rows.
    Entry("nograd_forward_buffer_sync", "nograd_forward_buffer_sync:NoGradForwardBufferSyncDDP",
          "25.1",
          "buffer-sync flag set by every forward whatever the grad mode: after a no_grad forward "
          "(train mode) the next forward re-broadcasts rank 0's buffers",
          "loop: forwards without backward between steps (no_grad / inference_mode, train or "
          "eval mode)",
          "https://github.com/pytorch/pytorch/issues/19896", True),
    Entry("multi_backward_overwrite", "multi_backward_overwrite:MultiBackwardOverwriteDDP", "25.2",
          "each synced backward writes the mean of its own gradients over .grad: earlier "
          "backwards of the same optimizer step are lost",
          "loop: several synced backward() calls per optimizer step",
          "https://github.com/pytorch/pytorch/pull/19799", True),
    Entry("unused_zero_to_none", "unused_zero_to_none:UnusedZeroToNoneDDP", "25.3",
          "find_unused_parameters: a globally unused parameter's zero gradient "
          "(zero_grad(set_to_none=False)) is set to None, so weight decay / momentum skip it",
          "loop: zero_grad(set_to_none=False) x globally unused parameters x SGD weight decay "
          "or momentum",
          "https://github.com/pytorch/pytorch/issues/41101", True),
    Entry("eval_mode_no_reduce", "eval_mode_no_reduce:EvalModeNoReduceDDP", "25.4",
          "gradients reduced only when module.training: a backward in eval mode keeps local "
          "gradients",
          "loop: backward with the module in eval mode (frozen BatchNorm fine-tuning)",
          "https://github.com/facebookresearch/fairscale/pull/587", True),
    Entry("reduce_waited_at_step", "reduce_waited_at_step:ReduceWaitedAtStepDDP", "25.5",
          "all-reduce started at the end of backward, waited and written into .grad only at "
          "optimizer.step (pre-hook) or the next forward: clip_grad_norm_ clips local gradients "
          "and is then overwritten",
          "loop: clip_grad_norm_ between backward and optimizer.step (also any check that reads "
          ".grad after backward)",
          "https://github.com/horovod/horovod/issues/1099", True),
    Entry("step_recommits_grads", "step_recommits_grads:StepRecommitsGradsDDP", "25.5b",
          "correct reduction, but the reduced buckets are copied into .grad again in an "
          "optimizer step pre-hook (master gradients): any edit of .grad between backward and "
          "step (clip_grad_norm_, unscaling a scaled loss) is undone",
          "loop: clip_grad_norm_ / loss-scale unscaling between backward and optimizer.step",
          "https://github.com/horovod/horovod/pull/1104", True),
    # Found from outside after issue 25 (a DDP written from the README and the fault kind "buffer
    # sync timing across forwards"): it passed the main command until scenario.loop drew two
    # forwards before one backward and grad-enabled forwards without backward.
    Entry("buffer_sync_per_iteration", "buffer_sync_per_iteration:BufferSyncPerIterationDDP", "25.9",
          "buffers broadcast once per iteration (at the first forward after a synced backward), "
          "not before every forward that follows a synced grad-enabled one",
          "loop: two forwards before one backward (GAN discriminator), a grad-enabled validation "
          "forward without backward",
          "https://github.com/pytorch/pytorch/issues/175024", True),
    # Written from outside by a helper given the README and the fault kind "buffer-sync timing in
    # users' loops" (tests/outside/loop_buffer_timing.py, kept unchanged): its correct DDP passes; of
    # its three faults the main command caught none (2026-12-03) until scenario.loop drew a second
    # DDP in the loop (25.10) and a raising forward the loop skips (25.12); freezing after wrapping
    # (25.11) since the loop draws a forward with every parameter frozen (loop.toggle).
    Entry("buffer_timing_correct", "loop_buffer_timing:CorrectDDP", "", "", "every check: must pass",
          "https://pytorch.org/docs/stable/notes/ddp.html", None),
    Entry("shared_forward_flag", "loop_buffer_timing:SharedStateDDP", "25.10",
          "the forward-sync flag is shared by every DDP instance in the process: a frozen teacher's "
          "no_grad forward clears the trained model's buffer broadcast",
          "loop: a second DDP in the loop (distillation teacher, GAN generator and discriminator)",
          "https://github.com/huggingface/accelerate/issues/1708", True),
    Entry("frozen_no_arm", "loop_buffer_timing:FrozenNoArmDDP", "25.11",
          "a grad-enabled forward arms the next buffer broadcast only if some parameter requires grad: "
          "a model frozen after wrapping (a GAN's D during the G step) does not",
          "module: trainability changed after wrapping (requires_grad_(False) on a wrapped model)",
          "https://github.com/pytorch/pytorch/issues/175024", True),
    Entry("consume_flag", "loop_buffer_timing:ConsumeFlagDDP", "25.12",
          "the forward-sync flag is cleared before the module runs and set after it returns: a forward "
          "that raises (skipped bad batch, OOM recovery) leaves the next forward without its broadcast",
          "loop: a forward that raises on every rank and is skipped by the loop",
          "https://github.com/pytorch/pytorch/issues/19896", True),
    Entry("structured_output_unused", "structured_output_unused:StructuredOutputUnusedDDP",
          "25.6",
          "find_unused_parameters: output tensors looked for in Tensor/tuple/list only; a dict or "
          "dataclass output makes every parameter count as unused, nothing is reduced",
          "module: forward returns a dict / dataclass, find_unused_parameters=True",
          "https://github.com/pytorch/pytorch/issues/19354", True),
    Entry("state_dict_buffers", "state_dict_buffers:StateDictBuffersDDP", "25.7",
          "buffers broadcast from module.state_dict(): non-persistent buffers never broadcast",
          "module: a buffer registered with persistent=False",
          "https://github.com/EvolvingLMMs-Lab/lmms-engine/pull/185", True),
    Entry("forward_bypasses_hooks", "forward_bypasses_hooks:ForwardBypassesHooksDDP", "25.8",
          "calls self.module.forward(...) instead of self.module(...): the wrapped module's own "
          "forward (pre-)hooks never run",
          "module: forward pre-hooks / forward hooks on the wrapped module",
          "https://github.com/numenta/nupic.torch/pull/51", True),
    # Issue 25 item 6, one faulty DDP per module / initial-state dimension, written from scratch
    # on torch.distributed from the README alone (module_axis_correct.py, the control, and one
    # subclass per fault overriding one small method). Measured 2026-12-03, the main command per
    # entry (``run --ddp <spec>`` with the findings file of torch 2.13 passed by hand,
    # default world sizes 2 and 3): the control exits 0 (266 pass, 90 unsupported: no join, comm
    # hooks, buckets, static_graph), each faulty entry exits 1. int_buffers_skipped is caught only
    # by its construction-time part (property.broadcast names '1.num_batches_tracked'); no
    # training case has an integer buffer whose value differs between replicas (buffer_kinds'
    # int64 counter is += 1 on every replica), so the per-forward skip alone is not exercised.
    Entry("module_axis_correct", "module_axis_correct:Class", "", "",
          "every check: must pass (graph-walk find_unused_parameters, per-dtype flat all-reduce)",
          "https://pytorch.org/docs/stable/notes/ddp.html", None),
    Entry("module_axis_forward_kwargs_dropped", "module_axis_forward_kwargs_dropped:Class",
          "25.i6.1",
          "forward(*args, **kwargs) calls the module with the positional arguments only: keyword "
          "arguments (scale=) silently dropped, the module computes its default",
          "module: a forward taking keyword arguments with defaults",
          "https://github.com/KevinMusgrave/pytorch-metric-learning/issues/701", True),
    Entry("module_axis_int_buffers_skipped", "module_axis_int_buffers_skipped:Class", "25.i6.2",
          "buffer broadcasts (construction and before each training forward) send floating-point "
          "buffers only: integer buffers (num_batches_tracked, step counters) stay per replica",
          "module: integer buffers differing between replicas (caught at construction only)",
          "https://github.com/pytorch/pytorch/issues/63916", True),
    # The half of 25.i6.2 its measurement left unexercised (construction synced, the per-forward
    # broadcast float-only): caught since scenario.loop draws an int64 sample counter (measured
    # 2026-12-03: scenario.loop buffers at W=2 and 3, "int64 buffer 'seen' counting the local samples").
    Entry("module_axis_int_buffers_unsynced_per_forward", "module_axis_int_buffers_unsynced_per_forward:Class",
          "25.i6.2b",
          "the broadcast before each training forward sends floating-point buffers only (construction "
          "sends all): a data-dependent integer buffer drifts apart after the first step",
          "module: integer buffers whose value depends on the local batch",
          "https://github.com/pytorch/pytorch/issues/63916", True),
    Entry("module_axis_parametrization_original_unsynced",
          "module_axis_parametrization_original_unsynced:Class", "25.i6.3",
          "construction broadcast over named_parameters() skipping names containing "
          "'parametrizations': '<m>.parametrizations.weight.original' keeps each replica's seed",
          "module: torch.nn.utils.parametrize x replicas built from different seeds",
          "https://github.com/pytorch/pytorch/issues/61470", True),
    Entry("module_axis_container_params_unsynced", "module_axis_container_params_unsynced:Class",
          "25.i6.4",
          "gradient hooks / reduction list built from each module's direct _parameters, skipping "
          "nn.ParameterList / nn.ParameterDict: their gradients stay local",
          "module: parameters held in nn.ParameterList / nn.ParameterDict",
          "https://github.com/pytorch/pytorch/issues/36035", True),
    Entry("module_axis_no_initial_broadcast", "module_axis_no_initial_broadcast:Class",
          "25.i6.5",
          "broadcast_buffers=False also skips the construction-time parameter broadcast: replicas "
          "built from different seeds stay different",
          "initial state: per-rank seeds x broadcast_buffers=False",
          "https://github.com/pytorch/pytorch/issues/111138", True),
    Entry("module_axis_namedtuple_output_unused", "module_axis_namedtuple_output_unused:Class",
          "25.i6.6",
          "find_unused_parameters (autograd-graph walk from the output tensors): outputs looked "
          "for in Tensor / exact tuple or list / dict only, not namedtuple or dataclass: those "
          "parameters count as unused, gradients never reduced",
          "module: forward returns a namedtuple / dataclass, find_unused_parameters=True",
          "https://github.com/pytorch/pytorch/issues/22436", True),
    # The transparency DDPs (transparency_named.py, transparency_new.py): each changes what the module,
    # the optimizer, the RNG or the user's code observes; measured 2026-12-06, the main command per entry.
    Entry("transparency_exact_bucket_drop", "transparency_named:ExactBucketDropDDP", "37.1",
          "the last bucket is not reduced when it was closed exactly at bucket_cap_mb",
          "keyword boundary: a bucket cap equal to the gradients' bytes (scenario.buckets)",
          "https://github.com/deepspeedai/DeepSpeed/pull/1214", True),
    Entry("transparency_param_swap", "transparency_named:ParamSwapDDP", "37.2",
          "parameters replaced by new nn.Parameter objects at wrap time: an optimizer built before "
          "wrapping updates tensors that no longer train",
          "transparency: parameter identity after wrapping",
          "https://github.com/microsoft/nni/issues/4521", True),
    Entry("transparency_rng_sync", "transparency_named:RngSyncDDP", "37.3",
          "every replica's default generator set to rank 0's at wrap time: per-rank dropout masks equal",
          "transparency: the RNG state after wrapping",
          "https://github.com/huggingface/transformers/issues/31412", True),
    Entry("transparency_rng_consume", "transparency_new:RngConsumingDDP", "37.4",
          "draws from the default generator in every forward: the user's random stream shifts",
          "transparency: the RNG state around the DDP's forward",
          "https://github.com/pytorch/pytorch/issues/39716", True),
    Entry("transparency_unfreeze", "transparency_new:UnfreezeDDP", "37.5",
          "requires_grad_(True) on every parameter at wrap time: frozen layers train",
          "transparency: requires_grad after wrapping (feature.frozen_params)",
          "https://github.com/facebookresearch/fairscale/issues/714", True),
    Entry("transparency_train_mode", "transparency_new:TrainModeDDP", "37.6",
          "module.train() at wrap time: submodules the user put in eval mode train",
          "transparency: training flags after wrapping",
          "https://github.com/Lightning-AI/pytorch-lightning/issues/18930", True),
    Entry("transparency_state_dict_prefix", "transparency_new:StateDictPrefixDDP", "37.7",
          "state_dict without the 'module.' prefix: checkpoints not interchangeable with torch's DDP",
          "transparency: the wrapper's state_dict keys",
          "https://github.com/mosaicml/composer/issues/829", True),
    Entry("transparency_user_hook_bypass", "transparency_new:UserHookBypassDDP", "37.8",
          "reduces the raw gradients its own wrap-time tensor hooks captured: a gradient hook the user "
          "registers after wrapping is lost from the reduced gradient",
          "module: a user's Tensor.register_hook after wrapping (scenario.loop grad_hook)",
          "https://github.com/huggingface/picotron/issues/39", True),
    Entry("transparency_output_copy", "transparency_new:OutputCopyDDP", "37.9",
          "structured outputs rebuilt as plain tuples / dicts: the user's output type is lost",
          "transparency: the output structure (parity.structured_output)",
          "https://github.com/pytorch/pytorch/issues/44009", True),
    # A helper's probe from outside (transparency_probe.py), given the README and the fault kind only:
    # the first two were missed by the oracle of a61f437 (strides; the default dtype leaked into later cases).
    Entry("transparency_default_dtype_leak", "transparency_probe:ProbeDefaultDtypeLeakDDP", "37.10",
          "the process's default dtype set to the module's widest floating dtype at wrap time, never restored",
          "transparency: process-wide torch settings (parity.float64)",
          "https://github.com/ACEsuit/mace/issues/1659", True),
    Entry("transparency_contiguous_params", "transparency_probe:ProbeContiguousParamsDDP", "37.11",
          "non-contiguous parameters made contiguous in place at wrap time: the user's layout is lost",
          "transparency: parameter layout (parity.channels_last)",
          "https://github.com/pytorch/pytorch/issues/79043", True),
    Entry("transparency_extra_buffer", "transparency_probe:ProbeExtraBufferDDP", "37.12",
          "a persistent step-counter buffer registered on the user's module: its state_dict grows a key",
          "transparency: the state_dict keys",
          "https://github.com/NVIDIA/physicsnemo/issues/586", True),
    # torch 2.13's keywords (keywords_2_13.py): a helper's DDPs from outside, given the README and
    # the fault kind only; modelled on the keywords' documented semantics.
    Entry("keywords_fsb_as_legacy_broadcast", "keywords_2_13:FsbAsLegacyBroadcast", "37.13",
          "forward_sync_buffers mapped onto the deprecated broadcast_buffers: False also skips the construction sync of buffers",
          "keywords: forward_sync_buffers (scenario.keywords)", "torch 2.13 DistributedDataParallel docstring: forward_sync_buffers", True),
    Entry("keywords_legacy_broadcast_as_fsb", "keywords_2_13:LegacyBroadcastAsFsb", "37.14",
          "broadcast_buffers translated into forward_sync_buffers: False still syncs buffers at construction",
          "keywords: broadcast_buffers (feature.broadcast_buffers_off, scenario.*)", "torch 2.13 DistributedDataParallel docstring: broadcast_buffers", True),
    Entry("keywords_legacy_broadcast_wins", "keywords_2_13:LegacyBroadcastWins", "37.15",
          "both given: broadcast_buffers honoured, forward_sync_buffers dropped (precedence inverted)",
          "keywords: forward_sync_buffers (scenario.keywords)", "torch 2.13 DistributedDataParallel docstring: forward_sync_buffers", True),
    Entry("keywords_init_sync_buffers_still_synced", "keywords_2_13:InitSyncFalseStillSyncsBuffers", "37.16",
          "init_sync=False skips the parameter broadcast but still broadcasts rank 0's buffers",
          "keywords: init_sync (scenario.keywords)", "torch 2.13 DistributedDataParallel docstring: init_sync", True),
    Entry("keywords_init_sync_ignored", "keywords_2_13:InitSyncIgnored", "37.17",
          "init_sync accepted and never passed on: parameters and buffers broadcast anyway",
          "keywords: init_sync (scenario.keywords)", "torch 2.13 DistributedDataParallel docstring: init_sync", True),
    Entry("keywords_bucket_list_last_dropped", "keywords_2_13:BucketListDropsLastBucket", "37.18",
          "with bucket_cap_mb_list and several buckets the last bucket is never all-reduced",
          "keywords: bucket_cap_mb_list (scenario.keywords)", "torch 2.13 DistributedDataParallel docstring: bucket_cap_mb_list", True),
    Entry("keywords_batched_copy_no_average", "keywords_2_13:BatchedCopyNoAverage", "37.19",
          "batched_grad_copy=True sums gradients over replicas, never divides",
          "keywords: batched_grad_copy (scenario.keywords)", "torch 2.13 DistributedDataParallel docstring: batched_grad_copy", True),
    Entry("keywords_skip_unused_any_in_bucket", "keywords_2_13:SkipUnusedAnyInBucket", "37.20",
          "skip_all_reduce_unused_params=True skips a bucket when any (not all) of its parameters is unused",
          "keywords: skip_all_reduce_unused_params (scenario.keywords)", "torch 2.13 DistributedDataParallel docstring: skip_all_reduce_unused_params", True),
    # model structure: a helper's DDPs from outside, given the README only (structure_demo.py
    # shows each against torch's DDP)
    Entry("structure_control", "structure_control:DDP", "", "",
          "every check: must pass (a from-scratch DDP: flat all-reduce at the end of backward)",
          "https://pytorch.org/docs/stable/notes/ddp.html", None),
    Entry("structure_unrun_submodule", "structure_faults:UnrunSubmoduleDDP", "47.1",
          "a parameter is reduced only if its owning submodule was called as a module: "
          "MultiheadAttention's out_proj (used functionally) keeps its local gradient",
          "model structure: a submodule's weights read by its parent (attention)",
          "https://github.com/pytorch/pytorch/issues/78109", False),
    Entry("structure_root_params", "structure_faults:RootParamsDDP", "47.2",
          "parameters registered on a root that also has children are never broadcast or reduced",
          "model structure: a parameter on the root beside submodules (cls_token, logit_scale)",
          "https://github.com/openai/CLIP/issues/111", True),
    Entry("structure_root_params_children_only", "structure_faults:RootParamsChildrenOnlyDDP",
          "47.3", "only children's parameters are broadcast and reduced (a bare layer loses its own)",
          "model structure: parameters on the wrapped module itself",
          "https://github.com/openai/CLIP/issues/111", True),
    Entry("structure_none_positional", "structure_faults:NonePositionalDDP", "47.4",
          "positional None inputs dropped: later positional inputs shift into the wrong arguments",
          "model structure: a multi-input forward called with a positional None",
          "https://github.com/pytorch/pytorch/issues/33185", True),
    Entry("structure_storage_dedup", "structure_faults:StorageDedupDDP", "47.5",
          "tied weights detected by storage: distinct parameters viewing one storage synced once",
          "model structure: parameters that are views of one storage (a fused qkv split)",
          "https://github.com/safetensors/safetensors/pull/379", True),
    Entry("structure_big_param", "structure_faults:BigParamDDP", "47.6",
          "a gradient larger than the 25 MiB fusion buffer is averaged only for its first 25 MiB",
          "model structure: one parameter larger than the bucket (vocabulary embedding)",
          "https://github.com/deepspeedai/DeepSpeed/pull/3832", False),
    Entry("structure_lazy_params", "structure_faults:LazyParamsDDP", "47.7",
          "uninitialised lazy parameters skipped instead of refused: replicas diverge",
          "model structure: lazy modules (LazyLinear) wrapped before a dry run",
          "https://github.com/pyg-team/pytorch_geometric/issues/9692", False),
    Entry("structure_none_slot", "structure_faults:NoneSlotDDP", "47.8",
          "the per-module parameter walk stops at a None slot: MultiheadAttention's in_proj_bias "
          "is never synced",
          "model structure: a module registering a None parameter before real ones",
          "https://github.com/pytorch/pytorch/issues/26698", True),
    Entry("structure_nested_buffers", "structure_faults:NestedBuffersDDP", "47.9",
          "only the root's and direct children's buffers broadcast: nested BatchNorm stats differ",
          "model structure: buffers two levels deep",
          "https://github.com/facebookresearch/moco/issues/41", True),
    # training programs and worlds: a helper's DDPs from outside, given the README only
    # (program_demo.py shows each against torch's DDP)
    Entry("program_control", "program_control:ControlDDP", "", "",
          "every check: must pass (a from-scratch DDP: a flat buffer per dtype after backward)",
          "https://pytorch.org/docs/stable/notes/ddp.html", None),
    Entry("program_env_world_size", "program_faults:EnvWorldSizeDDP", "48.1",
          "gradients divided by os.environ['WORLD_SIZE'], not by the process group's size",
          "world: a launcher environment that disagrees with the process group",
          "https://github.com/kubeflow/trainer/issues/1790", True),
    Entry("program_env_rank", "program_faults:EnvRankDDP", "48.2",
          "the construction sync's source chosen by os.environ['RANK']",
          "world: RANK holding a node index (a launcher's environment)",
          "https://github.com/Lightning-AI/pytorch-lightning/issues/13374", True),
    Entry("program_cached_world", "program_faults:CachedWorldDDP", "48.3",
          "world size cached at class level on the first construction",
          "world: the default group destroyed and rebuilt with another size in one process",
          "https://github.com/pytorch/pytorch/issues/55967", False),
    Entry("program_state_dict_collective", "program_faults:StateDictCollectiveDDP", "48.4",
          "state_dict() runs a collective: rank-0-only checkpointing desynchronises the replicas",
          "program: `if rank == 0: torch.save(model.state_dict())`",
          "https://github.com/Lightning-AI/pytorch-lightning/issues/19045", True),
    Entry("program_rewrap", "program_faults:RewrapDDP", "48.5",
          "hooks registered once per module: a new wrapper reuses the old parameter list",
          "program: unfreeze, then wrap model.module again",
          "https://discuss.pytorch.org/t/how-does-distributeddataparallel-handle-parameters-"
          "whose-requires-grad-flag-is-false/90736", True),
    Entry("program_second_wrap", "program_faults:SecondWrapDDP", "48.6",
          "the construction broadcast runs once per process: a second model is never synced",
          "program: a second model or trial in the same world",
          "https://github.com/huggingface/transformers/issues/18609", True),
    Entry("program_no_grad_mid_step", "program_faults:NoGradMidStepDDP", "48.7",
          "a no_grad forward switches off the pending backward's gradient sync",
          "program: a no_grad forward between a training forward and its backward (pseudo-labels)",
          "https://github.com/constantinpape/torch-em/pull/116", True),
    # Surveyed programs and launchers (docs/programs.md, docs/worlds.md): written from scratch on the
    # outside CorrectDDP; each passed the default command before the statement or launcher was drawn.
    Entry("frozen_trainable_broadcast", "frozen_params:TrainableBroadcastDDP", "48.s1",
          "the construction broadcast sends only the parameters that require grad: a backbone frozen "
          "before wrapping keeps each replica's own initialisation",
          "loop: freeze stem (fine-tuning with a frozen backbone)",
          "https://docs.pytorch.org/tutorials/beginner/transfer_learning_tutorial.html", True),
    Entry("frozen_flat_grad", "frozen_params:FlatGradFrozenDDP", "48.s2",
          "a contiguous gradient buffer for every parameter: a frozen parameter gets a zero gradient, "
          "not None (momentum and weight decay move it, the optimizer keeps state for it)",
          "loop: freeze stem under momentum / weight decay",
          "https://github.com/NVIDIA/Megatron-LM/issues/1008", True),
    Entry("env_world_size", "launcher_env:EnvWorldSizeDDP", "48.w1",
          "the gradient mean's divisor read from the launcher's WORLD_SIZE (default 1): a sum under "
          "mp.spawn, which sets no launcher variables",
          "worlds: a launcher other than torchrun (mp.spawn at W=3)",
          "https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html", True),
    # Process-wide state left for the next implementation in the world (leaks.py; the PJRT-only
    # InitsProcessGroup, 50.1, is run by tests/test_isolation.py); measured 2026-12-07 with a correct
    # DDP after them in one command: each fails parity.linear's transparency verdict naming its change.
    Entry("leak_launcher_env", "leaks:SetsLauncherEnv", "50.2",
          "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE written into the process's environment at wrap time, left there",
          "transparency: process-wide state (docs/isolation.md)", "https://github.com/Lightning-AI/pytorch-lightning/issues/14916", True),
    Entry("leak_all_reduce_wrapped", "leaks:WrapsAllReduce", "50.3",
          "torch.distributed.all_reduce replaced with a counting wrapper, never put back",
          "transparency: process-wide state (docs/isolation.md)", "https://github.com/pytorch/pytorch/issues/82299", True),
    Entry("leak_linear_patched", "leaks:PatchesLinear", "50.4",
          "torch.nn.functional.linear replaced with an upcasting wrapper, never put back",
          "transparency: process-wide state (docs/isolation.md)", "https://github.com/microsoft/DeepSpeed/issues/2733", True),
    Entry("leak_global_forward_hook", "leaks:GlobalForwardHook", "50.5",
          "a global module forward hook (register_module_forward_hook) never removed",
          "transparency: process-wide state (docs/isolation.md)", "https://github.com/pytorch/pytorch/issues/78643", True),
    Entry("leak_autocast_on", "leaks:LeavesAutocast", "50.6",
          "autocast switched on for the forward and never off",
          "transparency: process-wide state (docs/isolation.md)", "https://github.com/pytorch/pytorch/issues/100245", True),
    Entry("leak_backend_registered", "leaks:RegistersBackend", "50.7",
          "a torch.distributed backend of its own registered at construction",
          "transparency: process-wide state (docs/isolation.md)", "https://github.com/pytorch/pytorch/issues/115331", True),
    # What the module returns and how the wrapper finds the graph from it (output_faults.py).
    Entry("output_control", "output_faults:ControlDDP", "", "", "every check: must pass",
          "https://pytorch.org/docs/stable/notes/ddp.html", None),
    Entry("output_exact_type", "output_faults:ModelOutputDDP", "47.o1",
          "output containers found by exact class: an OrderedDict subclass (HF ModelOutput) is a leaf, "
          "no gradient is averaged", "module output structure",
          "https://github.com/huggingface/transformers/issues/25357", True),
    Entry("output_first_anchor", "output_faults:FirstOutputAnchorDDP", "47.o2",
          "only the first output tensor carries the end-of-backward hook: unaveraged when the loss "
          "does not read that output", "several outputs, one unused by the loss",
          "https://github.com/pytorch/pytorch/issues/97030", False),
    Entry("output_checkpoint_blind", "output_faults:CheckpointBlindDDP", "47.o3",
          "only parameters reachable from the outputs' autograd graph are averaged: those behind a "
          "reentrant checkpoint keep their local gradient", "reentrant activation checkpointing",
          "https://github.com/pytorch/pytorch/issues/24005", True),
]

BY_NAME = {e.name: e for e in CATALOG}

# The first failing case of each faulty entry in the main command's default run (table order,
# world sizes 2 then 3), as ``case@W``: measured 2026-12-01 with ``catch_rate.py --together``
# (``run --ddp <every entry> --exitfirst-each``, JSON ``stopped_at_each``). tests/test_outside.py
# reruns exactly that case: a default run includes it, so its failure is the main command's
# exit 1 (``a+b@W``: case a runs first in the same world). Rerun the sweep and update the row
# when the kit's table changes.
CAUGHT_BY = {
    "accum_wrong_average": "feature.no_sync@2",
    "comm_hook_double_divide": "feature.comm_hook@2",
    "tied_weights_twice": "feature.tied_weights@2",
    "static_graph_first_iter": "feature.static_graph@2",
    "bucket_view_stale": "feature.bucket_view@2",
    "buffers_wrong_rank": "parity.batchnorm@2",
    "no_sync_sticky": "feature.no_sync@2",
    "unused_zero_filled": "feature.unused_parameters@2",
    "checkpoint_assign": "feature.checkpoint_resume@2",
    "join_drops_grads": "feature.join@2",
    "unused_in_accumulation": "scenario.core@2",
    "hook_order_pairing": "feature.unused_parameters@2",
    "cached_buffers": "scenario.core@2",
    "replica_drift": "parity.linear@2",
    "late_fault": "scenario.core@2",
    "batch_weighted": "scenario.core@2",
    "sharded_floor_tail": "property.allreduce_mean@2",
    "sharded_gather_order": "parity.linear@2",
    "sharded_own_shard_scale": "parity.linear@2",
    "sharded_partition_accumulates": "parity.linear@2",
    "sharded_predivide_int": "parity.linear@3",
    "sharded_unused_not_written": "feature.unused_parameters@2",
    "local_world_divisor": "parity.linear@2",
    "group_global_divide": "feature.subgroups@3",
    "group_broadcast_rank0": "feature.subgroups@3",
    "first_firing_snapshot": "parity.checkpoint_reentrant@2",
    "comm_hook_reads_buffer": "feature.comm_hook_out_of_place@2",
    "sparse_grads_unsynced": "parity.sparse_embedding@2",
    "strided_unpack": "parity.channels_last@2",
    "complex_real_bucket": "parity.complex64@2",
    "fp32_fusion_buffer": "parity.float64@2",
    "sparse_last_micro_step": "scenario.workload@2",
    "nograd_forward_buffer_sync": "scenario.loop@2",
    "multi_backward_overwrite": "scenario.loop@2",
    "unused_zero_to_none": "scenario.loop@2",
    "eval_mode_no_reduce": "scenario.loop@2",
    "buffer_sync_per_iteration": "scenario.loop@2",
    "shared_forward_flag": "scenario.loop@2",
    "consume_flag": "scenario.loop@2",
    "reduce_waited_at_step": "feature.unused_parameters@2",
    "step_recommits_grads": "scenario.core@2",
    "structured_output_unused": "parity.structured_output_unused@2",
    "state_dict_buffers": "parity.buffer_kinds@2",
    "forward_bypasses_hooks": "parity.hooks_containers@2",
    # issue 25 item 6: the first failing verdict of each main-command run (2026-12-03)
    "module_axis_forward_kwargs_dropped": "feature.unused_parameters@2",
    "module_axis_int_buffers_skipped": "property.broadcast@2",
    "module_axis_int_buffers_unsynced_per_forward": "scenario.loop@2",
    "module_axis_parametrization_original_unsynced": "parity.hooks_containers@2",
    "module_axis_container_params_unsynced": "parity.hooks_containers@2",
    "module_axis_no_initial_broadcast": "feature.broadcast_buffers_off@2",
    "module_axis_namedtuple_output_unused": "scenario.loop@2",
    "transparency_exact_bucket_drop": "scenario.buckets@2",
    "transparency_param_swap": "parity.mlp@2",
    "transparency_rng_sync": "parity.mlp@2",
    "transparency_rng_consume": "parity.mlp@2",
    "transparency_unfreeze": "feature.frozen_params@2",
    "transparency_train_mode": "parity.mlp@2",
    "transparency_state_dict_prefix": "parity.mlp@2",
    "transparency_user_hook_bypass": "scenario.loop@2",
    "transparency_output_copy": "parity.structured_output@2",
    "transparency_default_dtype_leak": "parity.float64@2",
    "transparency_contiguous_params": "parity.channels_last@2",
    "transparency_extra_buffer": "parity.linear@2",
    # measured 2026-12-06, the main command per entry (each also fails finding 12, inherited)
    "keywords_fsb_as_legacy_broadcast": "scenario.keywords@2",
    "keywords_legacy_broadcast_as_fsb": "feature.broadcast_buffers_off@2",
    "keywords_legacy_broadcast_wins": "scenario.keywords@2",
    "keywords_init_sync_buffers_still_synced": "scenario.keywords@2",
    "keywords_init_sync_ignored": "scenario.keywords@2",
    "keywords_bucket_list_last_dropped": "scenario.keywords@2",
    "keywords_batched_copy_no_average": "scenario.keywords@2",
    "keywords_skip_unused_any_in_bucket": "scenario.keywords@2",
    # measured 2026-12-07, the main command per entry, before the zoo, topologies and surveys
    "structure_root_params": "parity.channels_last@2",
    "structure_root_params_children_only": "parity.linear@2",
    # a second construction in one process: caught after parity.linear built the first
    "program_second_wrap": "parity.linear+parity.mlp@2",
    # measured 2026-12-07 after the zoo, the topologies and the program statements (--only runs)
    "structure_none_positional": "scenario.topology@2",
    "structure_storage_dedup": "scenario.topology@2",
    "structure_none_slot": "scenario.topology@2",
    "structure_nested_buffers": "scenario.topology@2",
    "program_no_grad_mid_step": "scenario.loop@2",
    "program_state_dict_collective": "scenario.loop@2",
    # the loop statement unfreeze rewrap (docs/programs.md), ci profile
    "program_rewrap": "scenario.loop@2",
    # the W=3 world started as mp.spawn in a PyTorchJob pod (docs/worlds.md)
    "program_env_world_size": "parity.linear@3",
    "program_env_rank": "parity.linear@3",
    "frozen_no_arm": "scenario.loop@2",
    "frozen_trainable_broadcast": "scenario.loop@2",
    "frozen_flat_grad": "scenario.loop@2",
    "env_world_size": "parity.linear@3",
    "leak_launcher_env": "parity.linear@2",
    "leak_all_reduce_wrapped": "parity.linear@2",
    "leak_linear_patched": "parity.linear@2",
    "leak_global_forward_hook": "parity.linear@2",
    "leak_autocast_on": "parity.linear@2",
    "leak_backend_registered": "parity.linear@2",
    "output_exact_type": "scenario.loop@2",
    "output_checkpoint_blind": "parity.checkpoint_reentrant_reuse@2",
}
