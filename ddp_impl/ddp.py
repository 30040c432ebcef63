"""Reference data-parallel wrapper: per-parameter gradient all-reduce hooks.

Semantics mirrored from ``torch.nn.parallel.DistributedDataParallel`` (PyTorch
2.x, ``torch/nn/parallel/distributed.py``):

* construction broadcasts every parameter (and, with ``broadcast_buffers``, every
  buffer) from rank 0 (module-state sync, as ``init_sync=True``);
* after each parameter's gradient is accumulated, it is all-reduced and divided
  by the world size (mean over replicas), so with equal local batches and a
  mean-reduced loss every replica holds the gradient of the global batch;
* ``broadcast_buffers=True`` broadcasts buffers from rank 0 before a forward
  that runs with grad enabled outside :meth:`no_sync` (upstream's
  ``require_forward_param_sync``);
* :meth:`no_sync` lets gradients accumulate locally; the first backward after it
  reduces the accumulated gradients;
* ``find_unused_parameters=True`` defers the reduction to the end of backward,
  all-reduces a "used" mask first, leaves the gradient of a parameter no
  replica used untouched (``None``) and reduces a locally unused one as zeros
  (upstream's semantics for globally vs locally unused parameters).

The class is written against :class:`ddp_impl.collectives.Collectives`, so the
same code runs on torch.distributed (gloo) and on torch_xla (PJRT). Overridable
seams (``_sync_module_states``, ``_reduce_grad``, ``_sync_buffers``,
``_grad_scale``) are where the kit's mutants break it on purpose.
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

from .collectives import Collectives, TorchDistributedCollectives, default_collectives

# Keywords of torch.nn.parallel.DistributedDataParallel that this class accepts
# for drop-in use but does not implement.
IGNORED_TORCH_DDP_KWARGS = frozenset({
    "device_ids", "output_device", "dim", "bucket_cap_mb",
    "check_reduction", "gradient_as_bucket_view", "static_graph",
    "delay_all_reduce_named_params", "param_to_hook_all_reduce", "mixed_precision",
    "device_mesh", "init_sync", "skip_all_reduce_unused_params",
})


class DistributedDataParallel(nn.Module):
    """Wrap ``module`` so that its gradients are averaged across replicas.

    Args:
        module: the model; its parameters may have any shape and floating dtype.
        collectives: the :class:`Collectives` to use (default: the runtime's, see
            :func:`ddp_impl.collectives.default_collectives`).
        broadcast_buffers: broadcast buffers from rank 0 before each synced
            forward (default ``True``, as upstream).
        find_unused_parameters: tolerate parameters unused on some or all
            replicas (see the module docstring); costs one extra all-reduce.
        process_group: a torch.distributed group; shorthand for
            ``collectives=TorchDistributedCollectives(process_group)``.
        **kwargs: other ``torch.nn.parallel.DistributedDataParallel`` keywords are
            accepted and ignored with one ``UserWarning`` naming each of them.

    Raises:
        TypeError: for a keyword torch's DDP does not have either, or when both
            ``collectives`` and ``process_group`` are given.
        RuntimeError: when no runtime is initialised.
    """

    def __init__(self, module: nn.Module, *, collectives: Collectives | None = None,
                 broadcast_buffers: bool = True, process_group=None,
                 find_unused_parameters: bool = False, **kwargs):
        super().__init__()
        unknown = sorted(set(kwargs) - IGNORED_TORCH_DDP_KWARGS)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s) {unknown}")
        if kwargs:
            warnings.warn(
                "ddp_impl.DistributedDataParallel ignores constructor argument(s): "
                + ", ".join(f"{k}={kwargs[k]!r}" for k in sorted(kwargs)),
                UserWarning, stacklevel=2)
        if collectives is not None and process_group is not None:
            raise TypeError("pass either collectives or process_group, not both")
        if collectives is None:
            collectives = (TorchDistributedCollectives(process_group)
                           if process_group is not None else default_collectives())
        self.module = module
        self.collectives = collectives
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.ignored_kwargs = dict(kwargs)
        self._ready: set[int] = set()
        self._finalize_queued = False
        self.require_backward_grad_sync = True
        self._sync_module_states()
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for p in self.module.parameters() if p.requires_grad]

    # --- seams -----------------------------------------------------------
    def _grad_scale(self) -> float:
        """Factor applied to the summed gradient: ``1 / world_size``."""
        return 1.0 / self.collectives.world_size

    @torch.no_grad()
    def _sync_module_states(self) -> None:
        """Broadcast every parameter, and every buffer if ``broadcast_buffers``,
        from rank 0 (upstream passes ``broadcast_buffers`` to its module-state sync)."""
        states = list(self.module.parameters())
        if self.broadcast_buffers:
            states += list(self.module.buffers())
        for t in states:
            self.collectives.broadcast_(t.data, src=0)

    @torch.no_grad()
    def _sync_buffers(self) -> None:
        """Broadcast every buffer from rank 0 (``broadcast_buffers=True``)."""
        for b in self.module.buffers():
            self.collectives.broadcast_(b, src=0)

    @torch.no_grad()
    def _reduce_grad(self, param: nn.Parameter) -> None:
        """All-reduce ``param.grad`` in place to the mean over replicas."""
        self.collectives.all_reduce_(param.grad, scale=self._grad_scale())

    # --- nn.Module / DDP API --------------------------------------------
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self.require_backward_grad_sync or param.grad is None:
            return
        if not self.find_unused_parameters:
            self._reduce_grad(param)
            return
        self._ready.add(id(param))
        if not self._finalize_queued:
            self._finalize_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)

    @torch.no_grad()
    def _global_use_counts(self, params) -> list[float]:
        """How many replicas used each of ``params`` in this backward (host floats).

        The mask is all-reduced and read back on the host, because whether a
        gradient stays ``None`` is a host decision. Lazy runtimes (XLA) need the
        collectives' optional ``sync()`` twice: before the all-reduce, to run
        this replica's own forward/backward, which may differ between replicas
        (that is why parameters go unused), so that the all-reduce's graph is
        the same everywhere; and before the read, which would otherwise compile
        the collective per replica outside the step lock (``ddp_impl.xla``).
        """
        used = torch.tensor([float(id(p) in self._ready) for p in params])
        self._ready.clear()
        device = params[0].device if params else used.device
        self._sync()
        used = self.collectives.all_reduce_(used.to(device))
        self._sync()
        return used.cpu().tolist()

    def _sync(self) -> None:
        sync = getattr(self.collectives, "sync", None)
        if sync is not None:
            sync()

    @torch.no_grad()
    def _finalize_backward(self) -> None:
        """End of backward with ``find_unused_parameters``: reduce in a fixed order."""
        self._finalize_queued = False
        params = [p for p in self.module.parameters() if p.requires_grad]
        reduce = []
        for p, count in zip(params, self._global_use_counts(params)):
            if count == 0:
                continue  # globally unused: gradient untouched
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            reduce.append(p)
        if getattr(self.collectives, "sync", None) is not None:
            # Lazy runtimes (XLA): every replica's reduction graph must be the same,
            # but a gradient from backward is a view (its in-place update adds view
            # ops to the graph) and a fresh zero one is not. Plain copies, run by the
            # sync, make all of them device data of the same kind.
            for p in reduce:
                p.grad = p.grad.clone()
            self._sync()
        for p in reduce:
            self._reduce_grad(p)

    def forward(self, *args, **kwargs):
        if (self.broadcast_buffers and torch.is_grad_enabled()
                and self.require_backward_grad_sync):
            self._sync_buffers()
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Skip the gradient all-reduce inside the block; gradients accumulate.

        Matches ``torch.nn.parallel.DistributedDataParallel.no_sync``: the first
        backward outside the block reduces the accumulated gradients.
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
