"""Names the CLI checks before torch is imported: the tables that define them (the case
table, the implementation rows, the mutant catalog) import torch, which takes seconds.
``tests/test_cli.py::test_early_names_are_the_tables`` keeps these copies equal to the tables
(and prints the new literals when a case, row or mutant is added)."""

# Every tag of the case table (conformance.cases.row.tags_of), sorted.
TAGS = (
    'aliased_output', 'aliased_output.all_gather_into_tensor',
    'aliased_output.reduce_scatter_tensor', 'all_gather', 'all_gather_into_tensor', 'all_reduce',
    'all_to_all', 'all_to_all_single', 'allreduce_mean', 'backend', 'barrier', 'batch_isend_irecv',
    'batchnorm', 'broadcast', 'broadcast_buffers', 'broadcast_buffers_off', 'broadcast_buffers_on',
    'bucket_view', 'buckets', 'buffer_kinds', 'channels_last', 'channels_last_input',
    'channels_last_input.all_gather', 'channels_last_input.all_reduce',
    'channels_last_input.broadcast', 'channels_last_input.gather', 'channels_last_input.reduce',
    'checkpoint', 'checkpoint_activations', 'checkpoint_ddp', 'checkpoint_module',
    'checkpoint_nonreentrant', 'checkpoint_reentrant', 'checkpoint_reentrant_reuse',
    'checkpoint_resume', 'collective', 'collective.aliased_output',
    'collective.aliased_output.all_gather_into_tensor',
    'collective.aliased_output.reduce_scatter_tensor', 'collective.all_gather',
    'collective.all_gather_into_tensor', 'collective.all_reduce', 'collective.all_to_all',
    'collective.all_to_all_single', 'collective.barrier', 'collective.batch_isend_irecv',
    'collective.broadcast', 'collective.channels_last_input',
    'collective.channels_last_input.all_gather', 'collective.channels_last_input.all_reduce',
    'collective.channels_last_input.broadcast', 'collective.channels_last_input.gather',
    'collective.channels_last_input.reduce', 'collective.gather', 'collective.noncontiguous',
    'collective.noncontiguous.all_gather', 'collective.noncontiguous.all_gather_into_tensor',
    'collective.noncontiguous.all_reduce', 'collective.noncontiguous.all_to_all_single',
    'collective.noncontiguous.broadcast', 'collective.noncontiguous.gather',
    'collective.noncontiguous.reduce', 'collective.noncontiguous.reduce_scatter',
    'collective.noncontiguous.reduce_scatter_tensor', 'collective.noncontiguous.scatter',
    'collective.reduce', 'collective.reduce_scatter', 'collective.reduce_scatter_tensor',
    'collective.reused_input', 'collective.reused_input.all_gather_into_tensor',
    'collective.reused_input.all_reduce', 'collective.reused_input.all_to_all_single',
    'collective.reused_input.broadcast', 'collective.reused_input.reduce',
    'collective.reused_input.reduce_scatter_tensor', 'collective.scatter', 'collective.search',
    'collective.send_recv', 'comm_hook', 'comm_hook_bf16', 'comm_hook_fp16',
    'comm_hook_out_of_place', 'comm_hook_powersgd', 'complex', 'complex64', 'core', 'dropout',
    'dtype', 'feature', 'feature.broadcast_buffers_off', 'feature.broadcast_buffers_on',
    'feature.bucket_view', 'feature.checkpoint_ddp', 'feature.checkpoint_module',
    'feature.checkpoint_resume', 'feature.comm_hook', 'feature.comm_hook_bf16',
    'feature.comm_hook_fp16', 'feature.comm_hook_out_of_place', 'feature.comm_hook_powersgd',
    'feature.frozen_params', 'feature.graph_agreement', 'feature.join', 'feature.mixed_precision',
    'feature.no_sync', 'feature.state_sync', 'feature.static_graph', 'feature.subgroups',
    'feature.sync_batchnorm', 'feature.tied_weights', 'feature.unused_parameters', 'float64',
    'frozen', 'frozen_params', 'full_batch_grad', 'gather', 'graph_agreement', 'graph_shape',
    'hooks_containers', 'hooks_parametrizations', 'invariant', 'invariant.ranks', 'join', 'keywords', 'layout',
    'linear', 'loop', 'mixed_dtype', 'mixed_precision', 'mlp', 'module', 'no_sync',
    'no_sync_accumulation', 'noncontiguous', 'noncontiguous.all_gather',
    'noncontiguous.all_gather_into_tensor', 'noncontiguous.all_reduce',
    'noncontiguous.all_to_all_single', 'noncontiguous.broadcast', 'noncontiguous.gather',
    'noncontiguous.reduce', 'noncontiguous.reduce_scatter', 'noncontiguous.reduce_scatter_tensor',
    'noncontiguous.scatter', 'output_structure', 'param_containers', 'parity', 'parity.batchnorm',
    'parity.buffer_kinds', 'parity.channels_last', 'parity.checkpoint_nonreentrant',
    'parity.checkpoint_reentrant', 'parity.checkpoint_reentrant_reuse', 'parity.complex64',
    'parity.dropout', 'parity.float64', 'parity.hooks_containers', 'parity.linear',
    'parity.mixed_dtype', 'parity.mlp', 'parity.shared_branches', 'parity.sparse_embedding',
    'parity.structured_output', 'parity.structured_output_unused', 'property',
    'property.allreduce_mean', 'property.broadcast', 'property.full_batch_grad',
    'property.no_sync_accumulation', 'property.rank_permutation', 'property.scale_linearity',
    'rank_permutation', 'ranks', 'reduce', 'reduce_scatter', 'reduce_scatter_tensor',
    'reused_input', 'reused_input.all_gather_into_tensor', 'reused_input.all_reduce',
    'reused_input.all_to_all_single', 'reused_input.broadcast', 'reused_input.reduce',
    'reused_input.reduce_scatter_tensor', 'rng', 'scale_linearity', 'scatter', 'scenario',
    'scenario.buckets', 'scenario.comm_hook', 'scenario.core', 'scenario.keywords', 'scenario.loop',
    'scenario.workload',
    'search', 'send_recv', 'shared_branches', 'sparse', 'sparse_embedding', 'state_sync',
    'static_graph', 'structured_output', 'structured_output_unused', 'subgroup', 'subgroups',
    'sync_batchnorm', 'tied', 'tied_weights', 'unused', 'unused_parameters', 'workload', 'xla',
)
# conformance.impls.builtin.IMPLS, in its order (error messages list them).
IMPLS = (
    'torch', 'ref', 'xla_recipe', 'torch_compile', 'torch_compiled_autograd', 'replicate', 'zero',
    'fsdp2', 'fsdp2_no_reshard', 'xla_spmd', 'xla_fsdpv2', 'xla_fsdp',
)
# conformance.impls.mutants.catalog.MUTANTS, in its order.
MUTANTS = (
    'no_grad_sync', 'sum_not_mean', 'wrong_count', 'no_initial_broadcast',
    'buffers_not_broadcast', 'last_param_unsynced', 'scale_twice', 'stale_gradient',
    'shard_mixup', 'clip_local_grad', 'buffers_always_broadcast', 'unused_zero_filled',
    'unused_skipped', 'reduce_only_in_training', 'eval_forward_skips_buffer_sync',
    'buffer_sync_ignores_grad_mode', 'buffer_sync_once_per_iteration', 'forward_sync_flag_shared',
    'forward_sync_flag_cleared_first',
    'synced_forward_zeroes_grads',
    'unused_by_this_backward_dropped', 'mean_at_optimizer_step', 'no_sync_ignored', 'no_sync_sticky', 'dropped_bucket',
    'exact_full_bucket_dropped',
    'static_graph_stale', 'unfreezes_params', 'unties_shared_weights',
    'state_dict_drops_buffers', 'load_assigns', 'reduce_at_first_firing',
    'finalize_at_first_firing', 'comm_hook_no_divide', 'comm_hook_value_ignored',
    'join_dropped', 'forward_sync_off_skips_init', 'init_sync_ignored', 'last_listed_bucket_unreduced',
    'batched_copy_undivided', 'sync_bn_local_stats', 'unused_accum_dropped', 'arrival_order_pairing',
    'cached_buffer_list', 'replica_drift', 'late_desync', 'batch_weighted', 'fp16_allreduce',
    'param_swap', 'rng_sync', 'rng_consume', 'train_mode_at_wrap', 'unfreeze_at_wrap',
    'state_dict_unprefixed', 'output_flattened', 'user_hook_bypassed', 'params_relaid', 'default_dtype_leak',
    'fsdp2_no_divide', 'fsdp2_wrong_mesh', 'zero_no_param_sync', 'torch_compile_eager',
    'group_sum_global_divide', 'broadcast_global_rank0', 'sparse_grad_unsynced',
    'strided_unpack', 'complex_real_bucket', 'fp32_fusion_buffer', 'output_walk_bare_tensor',
    'state_dict_buffers_only', 'forward_hooks_skipped', 'container_params_unsynced',
    'parametrized_layer_sync', 'forward_kwargs_dropped', 'float_buffers_only',
)


def unknown_impl(spec: str) -> str:
    """The one line for an implementation name that is no row (nor ``all``, a mutant, a module)."""
    return (f"unknown DDP implementation {spec!r}; use one of "
            f"{', '.join(IMPLS)}, all, mutant:<name> or package.module:obj")


def unknown_mutant(name: str) -> str:
    return f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}"
