"""Transparency of a DDP: one correct wrapper and six wrappers with one transparency fault each.

Written from scratch on ``torch.distributed`` (gloo, CPU) for testing the conformance kit from
outside; no code is shared with the kit or with torch's ``DistributedDataParallel`` (whose public
behaviour, read in ``torch/nn/parallel/distributed.py`` 2.13 and its documentation, is the model).

The principle: apart from gradients averaged over replicas and buffers broadcast from rank 0 (as
documented), whatever the module, the optimizer, the random number generators and the user's code
observe must be what they would observe without the DDP.

``TransparentDDP`` (correct)
    ``TransparentDDP(module, *, broadcast_buffers=True, process_group=None, bucket_cap_mb=None,
    find_unused_parameters=False, gradient_as_bucket_view=False)``; ``device_ids`` /
    ``output_device`` only ``None``, ``dim`` only 0; any other keyword raises ``TypeError``.
    Construction broadcasts every parameter (and every buffer when ``broadcast_buffers``) from
    rank 0 of the group. A post-accumulate-grad hook per parameter (it fires after the user's
    tensor hooks, on what accumulated into ``.grad``) marks the parameter used; the end of the
    backward (a callback queued from a pre-hook on the forward output's ``grad_fn``, so that it
    runs when the outermost backward ends, also under reentrant checkpoints) reduces the buckets
    (``bucket_cap_mb``, one dtype per bucket, in reverse registration order, every rank in the same
    order): each gradient times ``1/W``, summed. A parameter that no replica used since the last
    reduction keeps its ``.grad`` untouched; one used by some replicas is averaged with their
    gradients (zeros where a replica has none). Sparse gradients (``Embedding(sparse=True)``) are
    reduced sparse. Before each forward with grad enabled outside ``no_sync()`` that follows such a
    forward (or construction) the buffers are broadcast (``broadcast_buffers``), version counters
    preserved. ``no_sync()``; ``gradient_as_bucket_view`` (gradients of contiguous parameters
    become views of a persistent bucket buffer); ``.module``; ``state_dict`` keys ``module.*``.
    No ``join``, ``register_comm_hook``, ``static_graph``.

``RngConsumingDDP``
    Fault: every forward draws ``torch.randperm`` from the default generator (a bucket-priority
    shuffle), so the user's dropout masks and random augmentations after wrapping differ from an
    un-wrapped / torch-DDP run. Modelled on library code consuming the global RNG behind the user's
    back: keras-team/keras#8933 (``fit`` calls ``np.random.shuffle`` and alters the global random
    state), bigscience-workshop/Megatron-DeepSpeed#276 and NVIDIA/Megatron-LM#206 (the data loader
    drew a seed from the default generator on one rank only, shifting ``nn.Dropout``'s stream),
    pytorch/pytorch#39716 ("Do not modify global random state").

``UnfreezeDDP``
    Fault: at wrap time ``requires_grad_(True)`` on every parameter ("so that all are
    registered"), so layers frozen before wrapping (fine-tuning, LoRA) train. Modelled on
    ultralytics/yolov5#1213 (a later loop set ``requires_grad=True`` on every parameter and undid
    the freeze), facebookresearch/fairscale#714 ("if requires_grad is set before fsdp wrapping, it
    is not working correctly"), pytorch/torchtitan#3886 (re-registered parameters defaulted to one
    ``requires_grad``: "originally frozen parameters participate in updates").

``TrainModeDDP``
    Fault: the constructor calls ``module.train()``, so a module wrapped in eval mode (a frozen
    teacher, BatchNorm in eval) runs in train mode: dropout active, running statistics updated.
    Modelled on Lightning-AI/pytorch-lightning#2551 and #18930 (the loop called ``model.train()``
    and undid the user's ``eval()`` on frozen submodules), fixed in #18951 ("the fit-loop no
    longer calls .train() at the beginning").

``StateDictPrefixDDP``
    Fault: ``state_dict()`` returns the module's keys without ``module.`` and ``load_state_dict``
    expects them so: checkpoints are not interchangeable with torch's DDP (a torch-DDP checkpoint
    fails to load strictly: missing / unexpected keys). Modelled on mosaicml/composer#829
    ("Serialize model state without `module.` prefix when using DDP") and Deci-AI/super-gradients
    #1184; torch keeps the prefix on purpose (pytorch/pytorch#3805, #41048).

``UserHookBypassDDP``
    Fault: it captures each gradient with ``Tensor.register_hook`` at wrap time (so its hook runs
    before any hook the user registers later) and reduces the captured raw gradients, writing the
    mean into ``.grad``; a hook the user registers on a parameter after wrapping (``register_hook
    (lambda g: g * 0.5)``: scaling / clipping by hook) changes the local gradient only and is lost
    from the reduced one (torch reduces what accumulated into ``.grad``, after the user's tensor
    hooks). Modelled on huggingface/picotron#39 (picotron's DDP reduces from a ``register_hook``
    on the gradient instead of ``register_post_accumulate_grad_hook`` on the parameter) and
    pytorch/pytorch#8023 (a tensor hook sees one contribution, not the accumulated gradient).

``OutputCopyDDP``
    Fault: the output is rebuilt: a namedtuple comes back as a plain ``tuple``, a dict subclass
    (``OrderedDict``, HF ``ModelOutput``) as a plain ``dict``, a dataclass as a ``dict`` of its
    fields, recursively; ``out.pred`` raises ``AttributeError``. Modelled on the scatter/gather
    code of ``torch.nn.parallel`` that DDP ran on its inputs and outputs: pytorch/pytorch#44009
    ("collections.namedtuple getting lost with DistributedDataParallel"), #38028 (namedtuple
    converted to a regular tuple), #50510 / #41327 (gather cannot rebuild namedtuple / dataclass
    outputs; proposed fix: treat dataclasses as dicts).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

__all__ = [
    "TransparentDDP",
    "RngConsumingDDP",
    "UnfreezeDDP",
    "TrainModeDDP",
    "StateDictPrefixDDP",
    "UserHookBypassDDP",
    "OutputCopyDDP",
]


def _tensors_in(obj, seen=None):
    """Every tensor in a (nested) output: tensors, tuples, lists, dicts, dataclasses."""
    if seen is None:
        seen = set()
    if id(obj) in seen:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors_in(x, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors_in(x, seen)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors_in(getattr(obj, f.name, None), seen)


class TransparentDDP(nn.Module):
    """A correct DDP on torch.distributed (see the module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        *,
        device_ids=None,
        output_device=None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group=None,
        bucket_cap_mb=None,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
    ):
        super().__init__()
        if device_ids not in (None, []) or output_device is not None or dim != 0:
            raise TypeError("TransparentDDP: CPU only; device_ids/output_device/dim unsupported")
        self.module = module
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.process_group)
        self._src = dist.get_global_rank(self.process_group, 0) if process_group is not None else 0
        self.broadcast_buffers = bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.bucket_cap_mb = 25.0 if bucket_cap_mb is None else float(bucket_cap_mb)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._prepare_module()
        self._sync_module_states()
        self._params = [p for _, p in module.named_parameters() if p.requires_grad]
        sparse_ids = set()
        for m in module.modules():
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and getattr(m, "sparse", False):
                sparse_ids.add(id(m.weight))
        self._sparse = [id(p) in sparse_ids for p in self._params]
        self._build_buckets()
        self._used = [False] * len(self._params)
        self._expect_sync = False
        self._callback_queued = False
        self._handles = []
        self._register_hooks()

    # -- construction -------------------------------------------------------------------------

    def _prepare_module(self) -> None:
        """A hook for variants; the correct DDP leaves the module as the user built it."""

    def _broadcast(self, t: torch.Tensor) -> None:
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        if x.dtype == torch.bool:
            x = x.view(torch.uint8)
        if x.is_contiguous():
            dist.broadcast(x, src=self._src, group=self.process_group)
        else:
            y = x.contiguous()
            dist.broadcast(y, src=self._src, group=self.process_group)
            x.copy_(y)

    @torch.no_grad()
    def _sync_module_states(self) -> None:
        for _, p in self.module.named_parameters():
            self._broadcast(p)
        if self.broadcast_buffers:
            for _, b in self.module.named_buffers():
                self._broadcast(b)

    def _build_buckets(self) -> None:
        cap = max(1, int(self.bucket_cap_mb * 1024 * 1024))
        buckets, current, size, key = [], [], 0, None
        for i in reversed(range(len(self._params))):
            p = self._params[i]
            if self._sparse[i]:
                buckets.append([i])
                continue
            k = p.dtype
            nbytes = p.numel() * p.element_size()
            if current and (k != key or size + nbytes > cap):
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
            key = k
        if current:
            buckets.append(current)
        self._buckets = buckets
        self._bucket_bufs = [None] * len(buckets)

    def _register_hooks(self) -> None:
        for i, p in enumerate(self._params):
            self._handles.append(p.register_post_accumulate_grad_hook(self._make_ready_hook(i)))

    def _make_ready_hook(self, i: int):
        def hook(_param):
            self._used[i] = True
            self._queue_finalize()

        return hook

    # -- forward ------------------------------------------------------------------------------

    @torch.no_grad()
    def _sync_buffers(self) -> None:
        bufs = [b for _, b in self.module.named_buffers()]
        if not bufs:
            return
        with torch.autograd._unsafe_preserve_version_counter(tuple(bufs)):
            for b in bufs:
                self._broadcast(b)

    def _output_prehook(self, _grad_outputs):
        self._queue_finalize()

    def _queue_finalize(self) -> None:
        if self._expect_sync and not self._callback_queued:
            self._callback_queued = True
            Variable._execution_engine.queue_callback(self._finalize)

    def _arm_backward(self, output) -> None:
        seen = set()
        for t in _tensors_in(output):
            fn = t.grad_fn
            if fn is not None and id(fn) not in seen:
                seen.add(id(fn))
                fn.register_prehook(self._output_prehook)

    def _run_module(self, inputs, kwargs):
        return self.module(*inputs, **kwargs)

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        output = self._run_module(inputs, kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            self._expect_sync = True
            self._arm_backward(output)
        else:
            self.require_forward_param_sync = False
            if torch.is_grad_enabled():
                self._expect_sync = False
        return self._wrap_output(output)

    def _wrap_output(self, output):
        return output

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # -- reduction ----------------------------------------------------------------------------

    def _local_grad(self, i: int):
        """This replica's contribution for parameter ``i`` (None: none)."""
        return self._params[i].grad

    def _after_sync(self) -> None:
        self._used = [False] * len(self._params)

    def _finalize(self) -> None:
        self._callback_queued = False
        if not self._expect_sync:
            return
        self._expect_sync = False
        with torch.no_grad():
            used = torch.tensor([1 if u else 0 for u in self._used], dtype=torch.int32)
            dist.all_reduce(used, group=self.process_group)
            scale = 1.0 / self.world_size
            for b, bucket in enumerate(self._buckets):
                if len(bucket) == 1 and self._sparse[bucket[0]]:
                    self._reduce_sparse(bucket[0], used, scale)
                else:
                    self._reduce_dense(b, bucket, used, scale)
        self._after_sync()

    def _reduce_sparse(self, i: int, used, scale: float) -> None:
        p = self._params[i]
        g = self._local_grad(i)
        if g is None:
            g = torch.zeros_like(p).to_sparse(1)
        elif not g.is_sparse:
            g = g.to_sparse(1)
        g = (g.coalesce() * scale).coalesce()
        dist.all_reduce(g, group=self.process_group)
        if used[i].item() > 0:
            p.grad = g

    def _reduce_dense(self, b: int, bucket, used, scale: float) -> None:
        params = [self._params[i] for i in bucket]
        numel = sum(p.numel() for p in params)
        if self.gradient_as_bucket_view:
            if self._bucket_bufs[b] is None:
                self._bucket_bufs[b] = torch.zeros(numel, dtype=params[0].dtype)
            flat = self._bucket_bufs[b]
        else:
            flat = torch.empty(numel, dtype=params[0].dtype)
        off = 0
        for i, p in zip(bucket, params):
            n = p.numel()
            g = self._local_grad(i)
            view = flat[off : off + n]
            if g is None:
                view.zero_()
            else:
                if g.is_sparse:
                    g = g.to_dense()
                view.copy_(g.reshape(-1))
            off += n
        flat.mul_(scale)
        dist.all_reduce(flat, group=self.process_group)
        off = 0
        for i, p in zip(bucket, params):
            n = p.numel()
            view = flat[off : off + n].view(p.shape)
            off += n
            if used[i].item() == 0:
                continue
            if self.gradient_as_bucket_view and p.is_contiguous():
                if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                    p.grad = view
                continue
            if p.grad is None:
                g = torch.empty_like(p, memory_format=torch.preserve_format)
                g.copy_(view)
                p.grad = g
            else:
                if p.grad.is_sparse:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)


class RngConsumingDDP(TransparentDDP):
    """Fault 1: draws from the default generator in every forward (see the module docstring)."""

    def _run_module(self, inputs, kwargs):
        # "Shuffle the bucket launch priority" each iteration: a draw from the global generator.
        self._bucket_priority = torch.randperm(max(2, len(self._buckets)))
        return self.module(*inputs, **kwargs)


class UnfreezeDDP(TransparentDDP):
    """Fault 2: ``requires_grad_(True)`` on every parameter at wrap time."""

    def _prepare_module(self) -> None:
        for p in self.module.parameters():
            p.requires_grad_(True)


class TrainModeDDP(TransparentDDP):
    """Fault 3: the constructor puts the wrapped module in train mode."""

    def _prepare_module(self) -> None:
        self.module.train()


class StateDictPrefixDDP(TransparentDDP):
    """Fault 4: ``state_dict`` / ``load_state_dict`` without the ``module.`` prefix."""

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        return self.module.state_dict(
            *args, destination=destination, prefix=prefix, keep_vars=keep_vars
        )

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)


class UserHookBypassDDP(TransparentDDP):
    """Fault 5: reduces the raw gradients its own wrap-time tensor hooks captured."""

    def _register_hooks(self) -> None:
        super()._register_hooks()
        self._captured = [None] * len(self._params)
        self._base = [None] * len(self._params)
        self._seen = [False] * len(self._params)
        for i, p in enumerate(self._params):
            self._handles.append(p.register_hook(self._make_capture_hook(i)))

    def _make_capture_hook(self, i: int):
        def hook(grad):
            p = self._params[i]
            if not self._seen[i]:
                # .grad before this window's first contribution (zeros, None or a stale value)
                self._seen[i] = True
                self._base[i] = None if p.grad is None else p.grad.detach().clone()
            raw = grad.detach()
            self._captured[i] = raw.clone() if self._captured[i] is None else self._captured[i] + raw
            return None

        return hook

    def _local_grad(self, i: int):
        if not self._seen[i]:
            return self._params[i].grad
        base, raw = self._base[i], self._captured[i]
        if base is None:
            return raw
        return base + raw

    def _after_sync(self) -> None:
        super()._after_sync()
        self._captured = [None] * len(self._params)
        self._base = [None] * len(self._params)
        self._seen = [False] * len(self._params)


def _plain(obj):
    """Rebuild an output with plain containers (namedtuple -> tuple, dataclass -> dict)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, tuple):
        return tuple(_plain(x) for x in obj)
    if isinstance(obj, list):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


class OutputCopyDDP(TransparentDDP):
    """Fault 6: structured outputs come back as plain tuples / dicts."""

    def _wrap_output(self, output):
        return _plain(output)
