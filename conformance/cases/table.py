"""The case table: every conformance case the kit runs, in one validated table.

Every face - the CLI, the pytest plugin, the absltest face, the kill matrix, ``calibrate``,
``run --repeat``, the JSON and HTML reports - iterates this table through
:func:`conformance.evaluate.evaluate`. The row type: :mod:`conformance.cases.row`; the
validation: :mod:`conformance.cases.validation`. Data only (rows name their tasks and judges by
reference), so the table loads without torch and the CLI checks ``--only`` / ``--skip`` tags
against it (:func:`all_tags`); :data:`CASES`, the validated table, is built on first use.
"""
from __future__ import annotations

from conformance.cases.collective.ops import LAYOUT_OPS, OPS
from conformance.cases.shared.checks import SCENARIO_CHECKS, scenario_checks
from conformance.cases.row import Case, select_rows, tags_of
from conformance.cases.validation import validate

#: Where the task rows' tasks and judges are (references: ``F + "task_no_sync"``).
F = "conformance.cases.task.kind:"
G = "conformance.cases.task.graphs:"

#: Faults every parity case on a plain model must kill.
CORE_FAULTS = ("no_grad_sync", "sum_not_mean", "wrong_count", "no_initial_broadcast", "last_param_unsynced",
               "scale_twice", "stale_gradient", "shard_mixup")
#: Faults of the shipped paths (conformance/impls/torch_paths.py): parity on a model without
#: buffers is where every shipped path runs.
SHIPPED_PATH_FAULTS = ("fsdp2_no_divide", "fsdp2_wrong_mesh", "zero_no_param_sync", "torch_compile_eager")

#: Bound on the join feature's task: its mutant hangs by design; a correct run (XLA compiles
#: included) takes a fraction of it.
JOIN_TIMEOUT_S = 15.0


def _parity(model, must_kill, description=None, tags=()):
    return Case(f"parity.{model}", "parity", description or f"training {model} with the DDP equals "
                "training on one device with the global batch, step by step; replicas agree bit for bit",
                "train", model, must_kill=must_kill, tags=tags)


def _feature_train(name, description, model, run, must_kill, tolerance="float32", tags=()):
    return Case(f"feature.{name}", "feature", description, "train", model, tolerance=tolerance, train=run,
                tags=(name,) + tags, must_kill=must_kill)


def _feature_task(name, description, model, task, judge, checks, must_kill, tolerance="float32",
                  timeout=None, tags=()):
    return Case(f"feature.{name}", "feature", description, "task", model, tolerance=tolerance, task=task,
                judge=judge, checks=checks, tags=(name,) + tags, must_kill=must_kill, timeout=timeout)


def _property(name, description, must_kill):
    return Case(f"property.{name}", "property", description, "property", tolerance="grad", prop=name,
                checks=("property",), must_kill=must_kill)


def _scenario(name, description, space, must_kill, tags=(), world_sizes=None):
    return Case(f"scenario.{name}", "scenario", description, "scenario", "scenario", args={"space": space},
                checks=scenario_checks(bool(space.get("loop"))), tags=tags,
                must_kill=must_kill, world_sizes=world_sizes or {})


def _collective(op, layout=None):
    """One op's case; with ``layout``, the op with one input layout: a case of its own, so a
    backend's known defect in one op (an expected failure) never hides a new one in another."""
    if layout is None:
        name, args, tags = f"collective.{op}", {"op": op}, ("backend",)
        description = (f"torch.distributed {op} on the world's backend equals its float64 host oracle on every "
                       "rank: bitwise where exact, within the reduction-order bound for floating sums"
                       + ("; every rank holds the same bits" if OPS[op].agree else ""))
    else:
        name, args, tags = f"collective.{layout}.{op}", {"layout": layout, "op": op}, (
            "backend", f"collective.{layout}", layout)
        description = (f"{op} with {LAYOUT_TEXT[layout]} equals its float64 host oracle on every rank (the "
                       "same checks as the op's own case)")
    return Case(name, "collective", description, "collective", tolerance="exact", args=args,
                checks=("result", "agreement", "coverage") if OPS[op].agree else ("result", "coverage"),
                tags=tags, timeout=COLLECTIVE_TIMEOUT_S)


#: What a layout case's inputs are, in its description.
LAYOUT_TEXT = {"noncontiguous": "inputs that are stride-2 views (not contiguous)",
               "channels_last_input": "4-D inputs in channels_last memory format",
               "aliased_output": "outputs that alias the input (the in-place forms)",
               "reused_input": "one input tensor passed twice, with new values the second time"}

#: Bound on one op's draws: far above what a correct world takes, so only a hang reaches it
#: (docs/collectives.md).
COLLECTIVE_TIMEOUT_S = 60.0


#: Parity on the core models: training with the DDP equals training on one device.
PARITY = (
    _parity("linear", CORE_FAULTS + SHIPPED_PATH_FAULTS),
    _parity("mlp", CORE_FAULTS + ("clip_local_grad",) + SHIPPED_PATH_FAULTS
            + ("param_swap", "rng_sync", "rng_consume", "train_mode_at_wrap", "state_dict_unprefixed",
               "all_reduce_wrapped", "launcher_env_set", "global_hook_left")),
    _parity("batchnorm", CORE_FAULTS + ("buffers_not_broadcast", "clip_local_grad")),
    _parity("dropout", ("no_grad_sync", "sum_not_mean", "rng_sync", "rng_consume"),
            "dropout between the layers, each replica's generator seeded per rank before wrapping (as a "
            "user seeds dropout): the reference replays each replica's masks from its own generator "
            "stream, so a DDP that draws random numbers or synchronises the generators changes the numbers",
            tags=("rng",)),
)


#: DDP's features: construction sync, buffers, unused parameters, no_sync, buckets, join, comm
#: hooks, SyncBatchNorm, autocast, checkpoints, frozen and tied parameters.
FEATURES = (
    _feature_task("state_sync", "replicas built from their own seeds differ before wrapping and hold "
                  "rank 0's parameters and buffers bit-identically after construction", "batchnorm",
                  F + "task_state_sync", F + "judge_state_sync", ("state_sync",), ("no_initial_broadcast",),
                  tolerance="exact"),
    _feature_task("broadcast_buffers_on", "broadcast_buffers=True: a buffer rank 0 changes is on every "
                  "replica after the next forward", "batchnorm", F + "task_buffers_on", F + "judge_buffers_on",
                  ("buffers",), ("buffers_not_broadcast",), tolerance="exact", tags=("broadcast_buffers",)),
    _feature_train("broadcast_buffers_off", "broadcast_buffers=False: buffers stay local and parity "
                   "holds with the matching reference", "batchnorm", {"broadcast_buffers": False},
                   ("buffers_always_broadcast",), tags=("broadcast_buffers",)),
    _feature_task("unused_parameters", "find_unused_parameters=True: a globally unused parameter keeps "
                  "grad None; a locally unused one is reduced as zeros", "unused", F + "task_unused",
                  F + "judge_unused", ("grads",), ("unused_zero_filled", "unused_skipped")),
    _feature_task("no_sync", "inside no_sync gradients stay local; the next synced backward reduces "
                  "the accumulated gradients", "linear", F + "task_no_sync", F + "judge_no_sync",
                  ("inside", "after"), ("no_sync_ignored", "no_sync_sticky")),
    _feature_train("bucket_view", "gradient_as_bucket_view=True with many small buckets keeps parity",
                   "mlp", {"ddp_kwargs": (("gradient_as_bucket_view", True), ("bucket_cap_mb", 0.25)),
                           "requires": ("gradient_as_bucket_view", "bucket_cap_mb")},
                   ("dropped_bucket",), tags=("buckets",)),
    _feature_train("static_graph", "static_graph=True keeps parity", "mlp",
                   {"ddp_kwargs": (("static_graph", True),), "requires": ("static_graph",)},
                   ("static_graph_stale",)),
    _feature_task("join", "uneven inputs under join(): no hang, and parameters equal the reference "
                  "with upstream's divide-by-initial-world-size semantics", "linear", F + "task_join",
                  F + "judge_join", ("params",), ("join_dropped",), timeout=JOIN_TIMEOUT_S),
    _feature_train("comm_hook", "a registered plain-averaging comm hook equals the default", "linear",
                   {"setups": ("comm_hook_allreduce",)}, ("comm_hook_no_divide",)),
    _feature_train("sync_batchnorm", "SyncBatchNorm over replicas equals BatchNorm on the global batch "
                   "(parameters, loss, running stats)", "batchnorm", {"setups": ("sync_bn",)},
                   ("sync_bn_local_stats",)),
    _feature_train("mixed_precision", "bfloat16 autocast forward keeps parity at the bf16 tolerance",
                   "linear", {"setups": ("autocast_bf16",)}, ("wrong_count",),
                   tolerance="bf16-autocast"),
    _feature_train("checkpoint_ddp", "state_dict of the DDP wrapper ('module.' prefix) saved mid-run "
                   "and reloaded gives the uninterrupted trajectory; optimizer state equal on all "
                   "replicas", "batchnorm", {"setups": ("checkpoint_ddp",), "momentum": 0.9},
                   ("state_dict_drops_buffers",), tags=("checkpoint",)),
    _feature_train("checkpoint_module", "the same with the inner module's state_dict (no prefix)",
                   "batchnorm", {"setups": ("checkpoint_module",), "momentum": 0.9},
                   ("stale_gradient",), tags=("checkpoint",)),
    _feature_train("checkpoint_resume", "the DDP wrapper's and optimizer's state_dicts loaded back into "
                   "the same live objects mid-run (a rollback) continue the uninterrupted trajectory",
                   "linear", {"setups": ("checkpoint_resume",), "momentum": 0.9}, ("load_assigns",),
                   tags=("checkpoint",)),
    _feature_train("frozen_params", "parameters with requires_grad=False stay frozen; parity holds",
                   "frozen", {}, ("unfreezes_params", "unfreeze_at_wrap")),
    _feature_train("tied_weights", "tied (shared) weights stay tied; parity holds", "tied", {},
                   ("unties_shared_weights",)),
)


#: Hypothesis properties of the synced gradients and of construction.
PROPERTIES = (
    _property("allreduce_mean", "a gradient pushed through the DDP comes back as the replicas' mean, "
              "bit-identical on every replica, within a rounding-error bound of the exact mean",
              ("sum_not_mean",)),
    _property("full_batch_grad", "synced gradients of random MLPs equal the single-device gradient "
              "on the global batch", ("no_grad_sync",)),
    _property("rank_permutation", "permuting which replica gets which shard leaves the synced "
              "gradients unchanged", ("last_param_unsynced",)),
    _property("broadcast", "construction makes every replica hold rank 0's parameters and buffers "
              "bit-identically; constructing again changes nothing", ("no_initial_broadcast",)),
    _property("no_sync_accumulation", "k no_sync micro-steps + one synced step give the sum of the "
              "micro-batches' global-batch gradients", ("no_grad_sync",)),
    _property("scale_linearity", "scaling every replica's loss by c scales the synced gradient by c",
              ("clip_local_grad",)),
)


#: Generated runs against DDP's semantics on one device (docs/scenarios.md).
SCENARIOS = (
    _scenario("core", "generated runs: uneven local batches, accumulation windows, rank-dependent "
              "branches and hook order, unused parameters, buffer rebinding, loss scale, checkpoint "
              "reload, SGD/momentum/Adam/AdamW, up to 120 steps; every step equals DDP's semantics "
              "on one device and replicas agree bit for bit", {},
              ("no_grad_sync", "sum_not_mean", "unused_accum_dropped", "arrival_order_pairing",
               "cached_buffer_list", "replica_drift", "late_desync", "batch_weighted",
               "fp16_allreduce")),
    # The loop axis (docs/scenarios.md, "The loop programs"): what a user's training
    # loop does around the DDP, drawn as a program of steps and shrunk to the shortest one.
    _scenario("loop", "generated training-loop programs: forwards without backward (no_grad / "
              "inference_mode / grad enabled / raising and skipped, eval / train mode) before, inside and "
              "after accumulation windows, several forwards before one backward, several synced backwards "
              "per step, a frozen teacher DDP, zero_grad(set_to_none=False), SGD with weight decay, "
              "backward in eval mode, gradient clipping, a learning-rate drop, the surveyed statements (a stem frozen "
              "before wrapping, a forward with every parameter frozen); every step equals DDP's "
              "semantics on one device; the module drawn too (dict / dataclass / namedtuple output, forward "
              "keywords, a non-persistent and an int64 buffer, a buffer feeding the output, a forward "
              "pre-hook, parametrizations, ParameterList / ParameterDict parameters, a gradient hook the "
              "user registers after wrapping)",
              {"loop": True, "budget": 0.25},
              ("no_grad_sync", "user_hook_bypassed", "unused_zero_filled", "reduce_only_in_training",
               "eval_forward_skips_buffer_sync", "buffer_sync_ignores_grad_mode", "buffer_sync_once_per_iteration",
               "forward_sync_flag_shared", "forward_sync_flag_cleared_first", "synced_forward_zeroes_grads",
               "unused_by_this_backward_dropped", "mean_at_optimizer_step", "output_walk_bare_tensor",
               "state_dict_buffers_only", "forward_hooks_skipped", "forward_kwargs_dropped", "float_buffers_only",
               "frozen_not_broadcast", "forward_sync_needs_trainable", "eval_buffers_synced_after_forward",
               "no_grad_forward_disarms", "state_dict_collective", "rewrap_reuses_hooks"),
              tags=("loop", "module")),
    _scenario("buckets", "the same with gradient buckets at the model's boundaries (caps below, at and above "
              "its gradients' sizes, buckets exactly full) and gradient_as_bucket_view",
              {"ddp_extra": ("buckets",), "budget": 0.5}, ("dropped_bucket", "exact_full_bucket_dropped"),
              tags=("buckets",)),
    _scenario("keywords", "generated loop programs with torch 2.13's keywords at each value class: "
              "init_sync both ways (equal parameters, each replica's own buffers), broadcast_buffers "
              "True / None / False, forward_sync_buffers None / True / False (the construction sync stays "
              "on), batched_grad_copy, bucket_cap_mb_list at the model's boundaries (the first bucket's "
              "size drawn), skip_all_reduce_unused_params with the same unused branches on every replica",
              {"ddp_extra": ("keywords",), "loop": True, "budget": 0.25},
              ("forward_sync_off_skips_init", "init_sync_ignored", "last_listed_bucket_unreduced",
               "batched_copy_undivided"), tags=("keywords",),
              # the keywords' faults are syncs skipped or added, not a divisor's arithmetic: the
              # odd world (W=3) of the CPU default adds cost, not power
              world_sizes={"cpu": (2,)}),
    _scenario("comm_hook", "the same with torch's all-reduce comm hook registered",
              {"ddp_extra": ("comm_hook",), "budget": 0.5}, ("comm_hook_no_divide",), tags=("comm_hook",)),
    # The workload axis drawn (docs/scenarios.md): the scenarios above on the workload
    # corners, with the keywords that interact with them (static_graph, small buckets, views).
    _scenario("workload", "the same on a drawn workload: float64 / complex64 / bfloat16 parameters, "
              "channels_last and transposed layouts, sparse Embedding(Bag) gradients, branches applied "
              "twice, under (non-)reentrant activation checkpointing or sharing a weight; with "
              "static_graph, small buckets and gradient_as_bucket_view",
              {"workload": True, "ddp_extra": ("buckets", "static_graph")},
              ("no_grad_sync", "sparse_grad_unsynced", "strided_unpack", "complex_real_bucket",
               "fp32_fusion_buffer", "reduce_at_first_firing"), tags=("workload",)),
    # Real models (docs/zoo.md): the loop programs on models drawn from the zoo (fixtures/zoo),
    # W=2 only on CPU (the draw, not the world size, is this case's axis).
    Case("scenario.zoo", "scenario", "the loop programs of scenario.user_loop on real models drawn from the zoo "
         "(torch.nn transformer, attention, recurrent, convolution and embedding layers; transformers' BERT and "
         "GPT-2 in tiny configurations), with each model's batches and loss, within the bound measured on the "
         "model; the profile sets how many and how costly", "scenario", args={"zoo": True},
         checks=tuple(SCENARIO_CHECKS), tags=("zoo", "loop"), must_kill=("no_grad_sync", "sum_not_mean"),
         world_sizes={"cpu": (2,)}),
    # Generated module graphs (docs/topologies.md): torch.nn layers, composite ones included, wired
    # as random graphs with every workload corner at any node, the same scenarios around them.
    _scenario("topology", "the same on a generated module graph: Linear / Conv / BatchNorm / LayerNorm / "
              "MultiheadAttention / TransformerEncoderLayer / LSTM / GRU / Embedding(Bag) nodes in branches and "
              "merges, one or two inputs, several outputs, each node's corners drawn (float64 / bfloat16 / "
              "complex64, transposed and channels_last weights, sparse gradients, applied twice, (non-)reentrant "
              "checkpointing, a module reused at two places, tied and frozen weights, gated by the replica's plan; "
              "the predictions returned in a dict / dataclass / namedtuple / ModelOutput-like, the heads maybe "
              "checkpointed)",
              {"topology": True, "ddp_extra": ("buckets", "static_graph")},
              ("no_grad_sync", "sum_not_mean", "sparse_grad_unsynced", "parent_params_unsynced",
               "deep_buffers_unsynced", "uncalled_owner_unsynced", "none_slot_stops_walk",
               "none_positional_dropped", "oversize_grad_truncated", "sink_misses_structured_output"),
              tags=("topology", "workload"),
              # the corners' faults are in what is reduced, not the divisor: the odd world (W=3) of
              # the CPU default adds cost, not power (scenario.core and scenario.workload run it)
              world_sizes={"cpu": (2,)}),
)


#: Graph shape (docs/scenarios.md): a parameter whose ready hook fires twice in one backward
#: (reentrant checkpoint; upstream needs static_graph), or once for two uses.
GRAPH_SHAPE = (
    Case("parity.checkpoint_reentrant", "parity", "a block applied twice under reentrant "
         "activation checkpointing (its gradient hook fires twice in one backward) with "
         "static_graph=True: the reduced gradient holds both contributions", "train",
         "checkpoint_reentrant", train={"ddp_kwargs": (("static_graph", True),),
                                        "requires": ("static_graph",)},
         tags=("graph_shape", "checkpoint_activations"),
         must_kill=("no_grad_sync", "reduce_at_first_firing")),
    # A parameter used outside and inside one reentrant checkpoint, default static_graph:
    # torch's DDP is silently wrong there (docs/findings.md, finding 12).
    Case("parity.checkpoint_reentrant_reuse", "parity", "a block used once outside and once inside "
         "a reentrant activation checkpoint, default DDP keywords (static_graph=False): the reduced "
         "gradient holds both contributions", "train", "checkpoint_reentrant_reuse",
         tags=("graph_shape", "checkpoint_activations"),
         must_kill=("no_grad_sync", "finalize_at_first_firing")),
    Case("parity.checkpoint_nonreentrant", "parity", "a block applied twice under non-reentrant "
         "activation checkpointing (one gradient hook firing) keeps parity", "train",
         "checkpoint_nonreentrant", train={"setups": ("checkpoint_nonreentrant",)},
         tags=("graph_shape", "checkpoint_activations"),
         must_kill=("no_grad_sync",)),
    Case("parity.shared_branches", "parity", "one Linear used on two branches of a forward (one "
         "gradient hook firing for two uses) keeps parity", "train", "shared_branches",
         tags=("graph_shape",), must_kill=("no_grad_sync",)),
)


#: Comm hooks that compress or return a new tensor (docs/scenarios.md).
COMM_HOOKS = (
    _feature_train("comm_hook_fp16", "torch's fp16_compress_hook registered: parity at the fp16 "
                   "compression tolerance", "linear", {"setups": ("comm_hook_fp16",)},
                   ("comm_hook_no_divide",), tolerance="fp16-comm", tags=("comm_hook",)),
    _feature_train("comm_hook_bf16", "torch's bf16_compress_hook registered: parity at the bf16 "
                   "compression tolerance", "linear", {"setups": ("comm_hook_bf16",)},
                   ("comm_hook_no_divide",), tolerance="bf16-comm", tags=("comm_hook",)),
    _feature_train("comm_hook_out_of_place", "a comm hook whose future's value is a new tensor "
                   "(the mean computed out of place, the bucket buffer untouched): the DDP writes "
                   "the future's value into the gradients; exact parity", "linear",
                   {"setups": ("comm_hook_out_of_place",)},
                   ("comm_hook_no_divide", "comm_hook_value_ignored"), tags=("comm_hook",)),
    _feature_task("comm_hook_powersgd", "torch's PowerSGD hook (rank 1, compressed from step 2): "
                  "replicas agree bit for bit and the loss falls by at least half exact DDP's fall "
                  "(parity is not judged: PowerSGD is lossy)", "linear", F + "task_powersgd",
                  F + "judge_powersgd", ("agreement", "loss_decrease"), (), tags=("comm_hook",)),
)


#: What replicas share beyond the gradients: one XLA step graph, rank bindings, process groups.
REPLICAS = (
    _feature_task("graph_agreement", "XLA: every replica builds the same step graph at construction "
                  "and at every step under torch_xla's default graph rules (a rank-dependent Python "
                  "constant is inlined, so on a pod the replicas recompile or wait in a collective), "
                  "even when the arithmetic is right; skipped where replicas build no XLA graphs",
                  "batchnorm",  # graphs.GRAPH_MODEL: buffers put a DDP's buffer broadcast in every step graph
                  G + "task_graph_agreement", G + "judge_graph_agreement", ("graph_agreement",), (), tags=("xla",)),
    Case("invariant.ranks", "invariant", "every replica's rank bindings satisfy the invariants "
         "(global ordinals 0..W-1, process indices 0..P-1, local ordinals per host, "
         "torch.distributed rank = process index)", "invariant", tolerance="exact",
         checks=("ranks",), tags=("ranks",)),
    Case("feature.subgroups", "feature", "DDP(module, process_group=g) with the world split into "
         "HSDP-style process groups of two ({0,1}, {2,3}; at W=3 {0,1}, {2}): each group is its own "
         "data-parallel job on its own global batch, averaged over the group (divisor = group size), "
         "starting from the group's first rank's parameters; replicas agree within each group",
         "train", "linear", train={"setups": ("process_groups",)}, tags=("subgroup",), world_sizes={"cpu": (3, 4), "pjrt": (4,)},
         must_kill=("group_sum_global_divide", "broadcast_global_rank0")),
)


#: The workload corners (docs/scenarios.md, "The workload axis"): gradient kind, layout, dtype.
WORKLOAD_CORNERS = (
    _parity("sparse_embedding", ("no_grad_sync", "sum_not_mean", "sparse_grad_unsynced"),
            "Embedding(sparse=True): sparse gradients are averaged over replicas like dense ones "
            "(upstream reduces them: pytorch#19443, #22037); parity and agreement", tags=("sparse",)),
    _parity("channels_last", ("no_grad_sync", "sum_not_mean", "strided_unpack", "params_relaid"),
            "a channels_last conv weight and a transposed (non-contiguous) parameter: the averaged "
            "gradient is written back element for element, whatever the strides (the gradient "
            "layout contract, pytorch#47163)", tags=("layout",)),
    _parity("complex64", ("no_grad_sync", "sum_not_mean", "complex_real_bucket"),
            "a complex64 weight: its gradient is averaged as complex (real and imaginary parts; "
            "pytorch#158753)", tags=("dtype", "complex")),
    _parity("float64", ("no_grad_sync", "sum_not_mean", "fp32_fusion_buffer", "default_dtype_leak"),
            "float64 parameters are reduced in float64 (buckets per dtype: PiPPy#656), at a "
            "float64 tolerance", tags=("dtype",)),
    _parity("mixed_dtype", ("no_grad_sync", "sum_not_mean"),
            "a bfloat16 layer between float32 layers: one bucket per dtype, each reduced in its "
            "own dtype", tags=("dtype",)),
)


#: The module axis (docs/scenarios.md, "The module axis"): what users' modules do.
MODULE_AXIS = (
    _parity("structured_output", ("no_grad_sync", "sum_not_mean", "forward_kwargs_dropped", "output_flattened"),
            "forward(x, *, scale) returns a dataclass holding a namedtuple (the prediction and a "
            "float), a dict (a tensor needing no grad, a str) and an int; the loss reads the "
            "prediction; default find_unused_parameters=False: parity and agreement",
            tags=("module", "output_structure")),
    Case("parity.structured_output_unused", "parity", "the same with find_unused_parameters=True: "
         "the DDP walks the dataclass, namedtuple and dict output to find the used parameters; "
         "parity and agreement", "train", "structured_output",
         train={"ddp_kwargs": (("find_unused_parameters", True),),
                "requires": ("find_unused_parameters",)},
         tags=("module", "output_structure"),
         must_kill=("no_grad_sync", "output_walk_bare_tensor")),
    Case("parity.structured_output_static", "parity", "the same with static_graph=True: the first "
         "iteration's reduction, which upstream delays to the end of the backward, is reached through "
         "the dataclass output; parity and agreement", "train", "structured_output",
         train={"ddp_kwargs": (("static_graph", True),), "requires": ("static_graph",)},
         tags=("module", "output_structure"), must_kill=("no_grad_sync", "static_graph_stale")),
    _parity("buffer_kinds", ("no_grad_sync", "buffers_not_broadcast", "state_dict_buffers_only"),
            "a persistent=False buffer (absent from state_dict) updated in place, an int64 step "
            "counter and a float buffer rebound in forward, each from the local batch; with "
            "broadcast_buffers=True every training forward starts from rank 0's buffers: "
            "parameters, loss, buffers and agreement", tags=("module", "buffer_kinds")),
    _parity("hooks_containers", ("no_grad_sync", "forward_hooks_skipped", "container_params_unsynced",
                                 "parametrized_layer_sync"),
            "a forward pre-hook on the wrapped module halves the input, a Linear's weight is "
            "parametrized (torch.nn.utils.parametrize, symmetric) and parameters sit in an "
            "nn.ParameterList and an nn.ParameterDict: parity and agreement",
            tags=("module", "hooks_parametrizations", "param_containers")),
)


#: One case per collective op, one per (layout, op), and the searched draws.
COLLECTIVES = tuple(_collective(op) for op in OPS) + tuple(
    _collective(op, layout) for layout, ops in LAYOUT_OPS.items() for op in ops) + (
    Case("collective.search", "collective", "collective draws searched by Hypothesis (op, dtype, "
         "reduction, any size up to 300000, completion mode, group, layout) equal their float64 host "
         "oracle on every rank; a failure is shrunk to its simplest draw", "collective",
         tolerance="exact", args={"search": True}, checks=("result", "agreement"),
         tags=("backend",), timeout=COLLECTIVE_TIMEOUT_S),
)

#: Every row, in the order the faces run them (validated into :data:`CASES` on first use).
ROWS = (PARITY + FEATURES + PROPERTIES + SCENARIOS + GRAPH_SHAPE + COMM_HOOKS + REPLICAS + WORKLOAD_CORNERS
        + MODULE_AXIS + COLLECTIVES)


_CASES: dict = {}  # name -> Case: ROWS validated, once per process


def cases() -> dict[str, Case]:
    """:data:`ROWS` validated (:func:`conformance.cases.validation.validate`), by name; built on
    the first call (also :data:`CASES`).

    Raises:
        ValueError: a row that does not validate (named).
    """
    if not _CASES:
        _CASES.update(validate(ROWS))
    return _CASES


def __getattr__(name):
    if name == "CASES":  # the validated table, built on first use (PEP 562)
        return cases()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def all_tags() -> frozenset:
    """Every tag that selects something (``--only`` / ``--skip`` accept these); needs no torch."""
    return tags_of(ROWS)


def select(only=(), skip=()) -> list[Case]:
    """Rows of :data:`CASES` carrying a tag of ``only`` (all rows if empty) and none of ``skip``.

    Raises:
        UsageError: a tag that selects nothing (the message lists the families).
    """
    return select_rows(cases().values(), only, skip)
