"""Implementation rows for torch_xla's shipped data-parallel paths beyond the
recipe (PJRT runtime): zero-argument factories that :data:`conformance.impls.builtin.ROWS` names.

* ``xla_spmd`` - SPMD data parallelism (torch_xla's SPMD user guide): one
  program under ``xr.use_spmd()``, a 1-D ``data`` mesh over the W devices, the
  global batch sharded along it with ``xs.mark_sharding``, parameters
  replicated; XLA's partitioner inserts the gradient all-reduce.
* ``xla_fsdpv2`` - ``torch_xla.experimental.spmd_fully_sharded_data_parallel.
  SpmdFullyShardedDataParallel`` on a 1-D ``fsdp`` mesh: parameters sharded
  along it, the batch too.

* ``xla_fsdp`` - ``torch_xla.distributed.fsdp.XlaFullyShardedDataParallel``
  (FSDPv1, per-replica collectives) in the thread topology: unsupported, with
  the reason :data:`XLA_FSDP_ON_PJRT`.

``xla_spmd`` and ``xla_fsdpv2`` run in the ``spmd`` topology (:mod:`conformance.worlds.runtimes.pjrt_spmd`): one
context trains on the whole global batch, so what DDP semantics mean there is
declared here as data:

* parameters are global tensors (``.cpu()`` gathers a sharded one), compared
  with the single-device reference like any row's;
* there are no per-replica copies, so replica agreement is not checked (the
  verdict says why);
* BatchNorm statistics are computed over the global batch - SyncBatchNorm's
  semantics. DDP's per-replica statistics cannot be expressed: a model with
  plain BatchNorm is unsupported; SyncBatchNorm (``sync_batchnorm`` below, a
  ``torch.nn.SyncBatchNorm`` that falls back to ``F.batch_norm`` without a
  process group) is what the program computes anyway;
* per-replica cases (tasks that drive replicas separately - ``no_sync``,
  ``join``, unused parameters -, properties over replicas' gradients, generated
  scenarios with per-replica batches) have no replica to address: unsupported.
"""
from __future__ import annotations

import weakref

from conformance.errors import Unsupported
from conformance.impls.row import Strategy, refuse_keywords, torch_sync_bn

NOT_ON = {"cpu": "needs torch_xla's SPMD (xr.use_spmd) on the PJRT runtime; run it with --runtime pjrt",
          "xrt": "SPMD needs PJRT (torch_xla >= 2.1); XRT has none"}
NO_COPIES = ("runs one SPMD program over the mesh: there are no per-replica parameter copies to agree "
             "(agreement is vacuous here; parameters are global tensors, compared with the reference)")
PER_REPLICA = ("SPMD runs one program over the mesh, with no per-replica Python, gradients or control "
               "flow for this case kind to drive")
UNSUPPORTED_KINDS = {"task": PER_REPLICA, "property": PER_REPLICA, "scenario": PER_REPLICA}
# Keywords with no SPMD counterpart that leave the math unchanged (accepted, not honoured).
SPMD_IGNORES = frozenset({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph",
                          "find_unused_parameters"})
SPMD_KWARGS = SPMD_IGNORES | {"broadcast_buffers"}
LOCAL_BN = ("under SPMD BatchNorm statistics are computed over the global batch (SyncBatchNorm "
            "semantics); DDP's per-replica statistics cannot be expressed")


def _refuse_local_batchnorm(module):
    import torch
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not isinstance(m, torch.nn.SyncBatchNorm):
            raise Unsupported(f"{LOCAL_BN} ({name or 'the model'} is a plain {type(m).__name__})")


def _mesh(ctx, axis):
    import numpy as np
    import torch_xla.distributed.spmd as xs
    n = ctx.extra["mesh_devices"]
    return xs.Mesh(np.arange(n), (n, 1), (axis, "model"))


def _sharding(t) -> str:
    import torch_xla
    return torch_xla._XLAC._get_xla_sharding_spec(t)


def _input_sharding(module, mesh, axis):
    """Shard every forward's tensor inputs along dim 0 over ``axis``; remember the
    last input's sharding for :func:`_require_sharded`."""
    import torch
    import torch_xla.distributed.spmd as xs

    def pre(mod, args):
        for a in args:
            if isinstance(a, torch.Tensor):
                xs.mark_sharding(a, mesh, (axis,) + (None,) * (a.dim() - 1))
                _SEEN[mod] = _sharding(a)
    module.register_forward_pre_hook(pre)


_SEEN = weakref.WeakKeyDictionary()  # wrapped module -> sharding spec of its last input


def _require_sharded(model, optimizer, ctx):
    """after_backward: refuse a step that ran unsharded (one device doing the
    whole batch would pass parity while testing nothing)."""
    spec = _SEEN.get(model, "")
    if not spec or "replicated" in spec:
        raise RuntimeError(f"the step's input was not sharded over the mesh (sharding {spec!r})")


def _require_sharded_params(model, optimizer, ctx):
    """after_backward of FSDPv2: :func:`_require_sharded`, and refuse parameters
    left replicated (data parallelism, not fully sharded)."""
    _require_sharded(model, optimizer, ctx)
    specs = [_sharding(p) for p in model.parameters() if p.dim() > 1]
    if not specs or all(not s or "replicated" in s for s in specs):
        raise RuntimeError(f"FSDPv2 left every parameter replicated (shardings {specs})")


def _wrap_spmd(module, ctx, kwargs):
    refuse_keywords("xla_spmd", kwargs, SPMD_KWARGS)
    _refuse_local_batchnorm(module)
    mesh = _mesh(ctx, "data")
    _input_sharding(module, mesh, "data")  # parameters stay replicated (the default)
    return module


def _wrap_fsdpv2(module, ctx, kwargs):
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel
    refuse_keywords("xla_fsdpv2", kwargs, SPMD_KWARGS)
    _refuse_local_batchnorm(module)
    mesh = _mesh(ctx, "fsdp")
    wrapped = SpmdFullyShardedDataParallel(module, mesh=mesh)
    _input_sharding(wrapped, mesh, "fsdp")
    return wrapped


#: xla_spmd has no wrapper: its input sharding is a forward pre-hook on the module (``Strategy.not_transparent``).
SPMD_HOOK = {"module_hooks": "no wrapper: the input is sharded by a forward pre-hook registered on the module itself"}

#: What SpmdFullyShardedDataParallel is documented to change: it registers a backward hook on the module
#: and keeps it as ``_orig_module``.
FSDPV2_CHANGES = {"module_hooks": "SpmdFullyShardedDataParallel registers a backward hook on the module",
                  "state_dict": "SpmdFullyShardedDataParallel holds the module as '_orig_module' (its state_dict "
                                "keys carry that prefix, not 'module.')"}


def _spmd_row(name, description, wrap, guard=_require_sharded, not_transparent=None):
    return Strategy(name, description, wrap, after_backward=guard, unsupported=NOT_ON,
                    not_transparent=dict(not_transparent or {}), sync_batchnorm=torch_sync_bn, ignores=SPMD_IGNORES,
                    holds_copies=False, no_copies_reason=NO_COPIES, topology={"pjrt": "spmd"},
                    unsupported_kinds=UNSUPPORTED_KINDS)


# Why FSDPv1 cannot run in the PJRT thread topology; tests/test_pjrt_runtime.py
# (test_xla_fsdp_in_threads_aborts) keeps this text true.
XLA_FSDP_ON_PJRT = (
    "unsupported topology: XlaFullyShardedDataParallel constructs in 1 process x W replica threads, "
    "but in the first training step the replicas' all-reduces carry different op ids (measured: 3 and "
    "4, i.e. the replicas compiled different graphs), never meet, and XLA aborts the host (Termination "
    "timeout for all reduce, 1 of W arrived); XLA's CPU collectives need one graph on every replica")


def _wrap_xla_fsdp(module, ctx, kwargs):
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel
    refuse_keywords("xla_fsdp", kwargs, SPMD_KWARGS)
    return XlaFullyShardedDataParallel(module, flatten_parameters=False)


def spmd_row() -> Strategy:
    """The ``xla_spmd`` row: SPMD data parallelism (module docstring)."""
    return _spmd_row("xla_spmd", "torch_xla SPMD data parallel: xr.use_spmd(), batch sharded with "
                     "xs.mark_sharding over a 1-D 'data' mesh, parameters replicated", _wrap_spmd,
                     not_transparent=SPMD_HOOK)


def fsdpv2_row() -> Strategy:
    """The ``xla_fsdpv2`` row: SpmdFullyShardedDataParallel (module docstring)."""
    return _spmd_row("xla_fsdpv2", "torch_xla SpmdFullyShardedDataParallel (FSDPv2) on a 1-D 'fsdp' "
                     "mesh: parameters and batch sharded", _wrap_fsdpv2, _require_sharded_params,
                     not_transparent=FSDPV2_CHANGES)


def xla_fsdp_row() -> Strategy:
    """The ``xla_fsdp`` row: FSDPv1, unsupported in the thread topology (:data:`XLA_FSDP_ON_PJRT`)."""
    return Strategy("xla_fsdp", "torch_xla XlaFullyShardedDataParallel (FSDPv1) in the thread topology",
                    _wrap_xla_fsdp, unsupported={"pjrt": XLA_FSDP_ON_PJRT, **NOT_ON}, holds_copies=False)
