"""Reference data-parallel wrapper: gradient buckets all-reduced in a fixed order.

Semantics mirrored from ``torch.nn.parallel.DistributedDataParallel`` (PyTorch
2.x, ``torch/nn/parallel/distributed.py`` and its C++ reducer,
``torch/csrc/distributed/c10d/reducer.cpp``):

* construction broadcasts every parameter (and every buffer, unless
  ``broadcast_buffers=False`` without ``forward_sync_buffers``) from rank 0 (module-state
  sync); ``init_sync=False`` skips it (torch 2.13's rule);
* parameters that require grad are split into *buckets* at construction (see
  :func:`assign_buckets`), never rebuilt: the same on every replica;
* a gradient's post-accumulate-grad hook marks it ready; a complete bucket is
  packed into its flat buffer and all-reduced asynchronously (or, where the
  collectives offer ``all_reduce_many`` - lazy XLA - reduced as a list of
  gradients, without the flat copy: see :meth:`DistributedDataParallel._pack`), but bucket ``i``
  only after buckets ``0..i-1`` (a fixed order on every replica even when hooks
  fire in a rank-dependent order). At the end of backward every handle is
  waited for and each ``.grad`` written from its bucket: the sum over replicas
  scaled by ``1 / world_size``;
* ``gradient_as_bucket_view=True``: after a synced backward ``p.grad`` *is* a
  view of its bucket buffer (the next backward accumulates into it in place);
* ``forward_sync_buffers`` (None: ``broadcast_buffers``, default True) broadcasts buffers
  from rank 0 before a forward when the previous forward was a synced one with grad enabled
  (or there was none): the start of an accumulation window, as upstream's
  ``require_forward_param_sync``;
* :meth:`no_sync` lets gradients accumulate locally; the first synced backward
  after it reduces the accumulated gradients;
* ``find_unused_parameters=True`` defers every bucket to the end of backward and
  all-reduces a "used" mask first: a parameter counts as used on a replica when
  it holds a gradient (this backward's or one accumulated under ``no_sync``,
  as upstream's ``local_used_map`` spans the accumulation window). A gradient
  no replica used stays untouched (``None``); a locally unused one is reduced
  as zeros. Without it, a parameter that gets no gradient is a ``RuntimeError``
  at the end of backward (upstream errors too);
* ``static_graph``: buckets never change here; what it adds is upstream's hook count. The
  first synced backward counts how often each parameter's hook fires and reduces every
  bucket at its end (upstream's first static-graph iteration delays all reduction too); later
  backwards mark a parameter ready at its last firing. A hook fires more than once when a
  parameter's gradient is accumulated in several (reentrant) backwards, e.g. a module applied
  twice under ``torch.utils.checkpoint(..., use_reentrant=True)``. Without ``static_graph`` a
  second firing is a ``RuntimeError`` (upstream: "Expected to mark a variable ready only
  once", pytorch/pytorch#84589) - unless the firing is a reentrant one (below);
* reentrant backwards without ``static_graph``: the end-of-backward callback is queued from the
  backward of the forward's outputs (an identity autograd node on every output tensor that
  requires grad, as upstream's ``_DDPSink``), so it runs when the outermost backward ends, not
  when a checkpoint's nested backward does (the first firing's backward is the fallback when
  the loss does not come from the outputs). A firing inside a nested backward makes this and
  every later backward reduce all buckets at its end, so a parameter used outside and inside
  a reentrant checkpoint is reduced with both contributions; a firing that arrives after its
  bucket was launched raises ``RuntimeError``. Upstream queues its callback at the first
  firing and, on such a model, silently all-reduces a partial gradient (docs/findings.md,
  finding 12);
* workload corners: buckets hold one dtype each (float64, bfloat16, complex: each reduced
  in its own dtype, complex as complex); a sparse gradient (``Embedding(sparse=True)``) is
  reduced dense and written back dense (upstream reduces it sparse: the same mean); a
  gradient is written back element for element in the parameter's logical order, so a
  channels_last or transposed parameter gets its own gradient (``copy_`` honours strides;
  with gradient_as_bucket_view the gradient is a contiguous slot; upstream strides the
  slot like its parameter).
* ``register_comm_hook(state, hook)``: a bucket is reduced by ``hook(state, GradBucket)``
  instead of the built-in average; the future's value (the averaged bucket, a new tensor or
  the buffer itself) is copied into the gradients, as upstream's reducer does. Only on
  torch.distributed: on the lazy XLA collectives it raises ``NotImplementedError``;
* the gradient hooks hold the wrapper weakly and are removed when it is
  collected: a wrapper nobody references any more reduces nothing (upstream's
  C++ reducer removes its autograd hooks in its destructor too); keep it while
  training.

Written against :class:`ddp_impl.runtime.collectives.Collectives`: the same code runs on
torch.distributed (gloo; asynchronous all-reduces) and lazily on torch_xla (PJRT;
complete handles, one graph per step). The seams ``_grad_scale``,
``_sync_module_states``, ``_sync_buffers``, ``_reduce_bucket``, ``_launch_ready``,
``_set_grad``, ``_firing_completes`` and ``_global_use_counts`` are where the kit's mutants break it.
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn


from ddp_impl.outputs import output_tensors
from ddp_impl.runtime.collectives import (Collectives, TorchDistributedCollectives, all_reduce_async, broadcast_many,
                                         default_collectives)

# torch DDP keywords accepted for drop-in use but not implemented (warned about).
IGNORED_TORCH_DDP_KWARGS = frozenset({
    "device_ids", "output_device", "dim", "check_reduction", "delay_all_reduce_named_params",
    "param_to_hook_all_reduce", "mixed_precision", "device_mesh", "skip_all_reduce_unused_params",
    "batched_grad_copy", "bucket_cap_mb_list"})
DEFAULT_BUCKET_CAP_MB = 25.0
MB = 2 ** 20
FIRST_BUCKET_BYTES = MB  # upstream's torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass
class Bucket:
    """One gradient bucket: ``params`` share the 1-D ``flat`` buffer (their
    dtype and device; ``None`` when the bucket is reduced as a list);
    ``slots[j]`` is the view of ``flat`` shaped like ``params[j]``; ``grads``
    is what the all-reduce reduces and backward's end writes back (the slots,
    or the gradients themselves); ``index`` is the launch position (0 first)."""

    index: int
    params: list
    flat: torch.Tensor | None
    slots: list = field(default_factory=list)
    grads: list = field(default_factory=list)


def assign_buckets(params, cap_bytes: float, first_cap_bytes: float) -> list[list]:
    """Split ``params`` into buckets: reverse registration order (roughly backward's),
    one dtype/device per bucket, a bucket closed once it holds ``>= cap`` bytes
    (upstream's ``_compute_bucket_assignment_by_size`` rule); the first of a
    dtype/device closes at ``first_cap_bytes`` (upstream: 1 MiB,
    ``_DEFAULT_FIRST_BUCKET_BYTES``, with the default cap). Returns lists of
    parameters in launch order (closed buckets, then the partial ones)."""
    done, open_, size, closed = [], {}, {}, set()
    for p in reversed(list(params)):
        key = (p.dtype, p.device)
        open_.setdefault(key, []).append(p)
        size[key] = size.get(key, 0) + p.numel() * p.element_size()
        if size[key] >= (cap_bytes if key in closed else first_cap_bytes):
            done.append(open_.pop(key))
            size[key] = 0
            closed.add(key)
    return done + list(open_.values())


def _weak_hook(obj, name: str):
    """A tensor hook calling ``obj.<name>`` while ``obj`` lives. A parameter's
    post-accumulate-grad hooks are hidden from Python's gc (torch 2.13), so a bound
    method there makes a cycle gc never frees: every wrapper, with its module and
    buckets, would stay alive for the life of the process."""
    ref = weakref.ref(obj)

    def hook(*args):
        o = ref()
        if o is not None:
            getattr(o, name)(*args)
    return hook


class _OutputSink(torch.autograd.Function):
    """Identity on the forward's output tensors; its backward (the first node of the
    outermost backward) queues the DDP's end-of-backward callback there. Mirrors the role of
    upstream's ``_DDPSink`` (``torch/nn/parallel/distributed.py``). Holds the DDP weakly."""

    @staticmethod
    def forward(ctx, ddp_ref, *tensors):
        ctx.ddp_ref = ddp_ref
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ddp = ctx.ddp_ref()
        if ddp is not None and ddp.require_backward_grad_sync:
            ddp._queue_finalize()
        return (None, *grads)


def _remove_hooks(handles) -> None:
    for h in handles:
        h.remove()


class GradBucket:
    """What a comm hook sees of one bucket (the methods torch's hooks use of
    ``torch.distributed.GradBucket``): ``buffer()`` the 1-D flat gradients (this replica's),
    ``gradients()`` their views shaped like ``parameters()``, ``index()`` the launch position,
    ``is_last()`` the last bucket of the backward, ``set_buffer(t)`` replaces the buffer's
    values with ``t``'s."""

    def __init__(self, bucket: Bucket, last: bool):
        self._b, self._last = bucket, last

    def buffer(self) -> torch.Tensor:
        return self._b.flat

    def gradients(self) -> list:
        return list(self._b.slots)

    def parameters(self) -> list:
        return list(self._b.params)

    def index(self) -> int:
        return self._b.index

    def is_last(self) -> bool:
        return self._last

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._b.flat.copy_(tensor)


class _HookedReduction:
    """The handle of a bucket reduced by a comm hook: ``wait()`` takes the future's value
    (the averaged bucket) into the bucket buffer, unless it is that buffer."""

    def __init__(self, flat: torch.Tensor, fut):
        self.flat, self.fut = flat, fut

    def wait(self) -> None:
        value = self.fut.wait()
        value = value[0] if isinstance(value, (list, tuple)) else value
        if value is not self.flat:
            with torch.no_grad():
                self.flat.copy_(value.reshape(-1))


class DistributedDataParallel(nn.Module):
    """Wrap ``module`` so that its gradients are averaged across replicas.

    Args:
        module: the model; parameters of any shape and floating dtype.
        collectives: the :class:`Collectives` to use (default: the runtime's, see
            :func:`ddp_impl.runtime.collectives.default_collectives`).
        broadcast_buffers: broadcast buffers from rank 0 before a forward that
            follows a synced one, and at construction (default ``True``; None is True).
        init_sync: broadcast rank 0's parameters (and buffers) at construction (default
            ``True``; ``False``: the caller built equal replicas).
        forward_sync_buffers: when not None, replaces ``broadcast_buffers`` for the forward
            sync and leaves the construction sync of buffers on (torch 2.13).
        find_unused_parameters: tolerate parameters unused on some or all
            replicas (see the module docstring); costs one extra all-reduce.
        process_group: a torch.distributed group; shorthand for
            ``collectives=TorchDistributedCollectives(process_group)``. As upstream,
            gradients are then averaged over the group (divisor = its size) and module
            states broadcast from the group's rank 0 (its lowest global rank).
        bucket_cap_mb: bucket size in MiB (default 25, as upstream).
        gradient_as_bucket_view: make ``p.grad`` a view of its bucket buffer.
        static_graph: a hint that the graph is the same every iteration.
        **kwargs: other ``torch.nn.parallel.DistributedDataParallel`` keywords are
            accepted and ignored with one ``UserWarning`` naming each of them
            (listed in ``self.ignored_kwargs``).

    Raises:
        TypeError: for a keyword torch's DDP does not have either, or when both
            ``collectives`` and ``process_group`` are given.
        RuntimeError: when no runtime is initialised; at the end of a synced
            backward, without ``find_unused_parameters``, when a parameter
            received no gradient (named in the message).
    """

    def __init__(self, module: nn.Module, *, collectives: Collectives | None = None,
                 broadcast_buffers: bool | None = True, process_group=None, init_sync: bool = True,
                 forward_sync_buffers: bool | None = None,
                 find_unused_parameters: bool = False, bucket_cap_mb: float | None = None,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, **kwargs):
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
        bcast = True if broadcast_buffers is None else broadcast_buffers
        self.broadcast_buffers = bcast if forward_sync_buffers is None else forward_sync_buffers
        self.init_sync_buffers = forward_sync_buffers is not None or bcast
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self._learning = static_graph  # the first synced backward counts hook firings
        self._hook_counts: dict[int, int] = {}  # id(param) -> firings per backward (static_graph)
        self._reentrant = False  # a hook fired in a nested backward (see the module docstring)
        self.ignored_kwargs = dict(kwargs)
        self._comm_hook = self._comm_state = None  # register_comm_hook
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        if init_sync:
            self._sync_module_states()  # first: a mutant may replace parameter objects
        cap = (DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MB
        params = [p for p in self.module.parameters() if p.requires_grad]
        # Lazy XLA: packing into a flat buffer and copying back cost more than the
        # collective (measured: 0.67x xla_recipe flat, 1.19x as a list; benchmarks/README.md).
        self._as_list = hasattr(collectives, "all_reduce_many") and not gradient_as_bucket_view
        self._buckets = []
        for i, ps in enumerate(assign_buckets(params, cap, FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap)):
            if self._as_list:
                self._buckets.append(Bucket(i, ps, None))
                continue
            flat = torch.zeros(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
            slots = [s.view_as(p) for s, p in zip(flat.split([p.numel() for p in ps]), ps)]
            self._buckets.append(Bucket(i, ps, flat, slots, slots))
        self._bucket_of = {id(p): b.index for b in self._buckets for p in b.params}
        self._names = {id(p): n for n, p in self.module.named_parameters()}
        self._reset()
        hook = _weak_hook(self, "_on_grad_ready")
        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in params]
        weakref.finalize(self, _remove_hooks, self._hooks)  # a kept module keeps no dead hooks

    # --- seams -----------------------------------------------------------
    def _grad_scale(self) -> float:
        """Factor applied to the summed gradient: ``1 / world_size``."""
        return 1.0 / self.collectives.world_size

    @torch.no_grad()
    def _sync_module_states(self) -> None:
        """Broadcast every parameter, and every buffer if ``init_sync_buffers``, from rank 0
        (upstream's module-state sync)."""
        states = [p.data for p in self.module.parameters()]
        if self.init_sync_buffers:
            states += list(self.module.buffers())
        broadcast_many(self.collectives, states, src=0)

    @torch.no_grad()
    def _sync_buffers(self) -> None:
        """Broadcast every buffer from rank 0. Reads ``module.buffers()`` now: a
        forward may have rebound a buffer to a new tensor."""
        broadcast_many(self.collectives, list(self.module.buffers()), src=0)

    def _reduce_bucket(self, bucket: Bucket):
        """Start the all-reduce of ``bucket.grads`` (sum, then ``_grad_scale()``);
        return a handle whose ``wait()`` completes it (or ``None``: nothing to wait)."""
        if bucket.flat is None:  # as a list: new tensors (lazy, nothing to wait for)
            bucket.grads = self.collectives.all_reduce_many(bucket.grads, scale=self._grad_scale())
            return None
        if self._comm_hook is not None:  # the hook averages; its future's value is the bucket
            return _HookedReduction(bucket.flat, self._comm_hook(
                self._comm_state, GradBucket(bucket, last=bucket.index == len(self._buckets) - 1)))
        return all_reduce_async(self.collectives, bucket.flat, scale=self._grad_scale())

    def _launch_ready(self, final: bool = False) -> None:
        """Pack and launch every complete bucket whose predecessors are launched
        (all the remaining ones when ``final``: the end of backward)."""
        while self._next < len(self._buckets) and (final or self._pending[self._next] == 0):
            bucket = self._buckets[self._next]
            self._pack(bucket)
            self._handles.append(self._reduce_bucket(bucket))
            self._next += 1

    def _firing_completes(self, param: nn.Parameter) -> bool:
        """Count this firing of ``param``'s hook; True when it is the last one of this
        backward (the parameter is ready). Firings per backward: 1, or what the first
        static-graph backward counted (while counting, only the first firing is).

        Raises:
            RuntimeError: more firings than expected (without ``static_graph``: a second).
        """
        n = self._fired[id(param)] = self._fired.get(id(param), 0) + 1
        if self._learning:
            return n == 1  # every bucket is reduced at the end of this backward
        need = self._hook_counts.get(id(param), 1)
        if n > need:
            raise RuntimeError(
                f"parameter {self._names[id(param)]}'s gradient hook fired {n} times in one backward "
                f"(expected {need}): a reentrant backward (torch.utils.checkpoint with "
                "use_reentrant=True) or a parameter used in several checkpointed regions; pass "
                "static_graph=True (upstream DDP: 'Expected to mark a variable ready only once', "
                "pytorch/pytorch#84589)")
        return n == need

    def _set_grad(self, param: nn.Parameter, reduced: torch.Tensor) -> None:
        """Make ``param.grad`` hold ``reduced`` (shaped like ``param``: the
        replica mean), as a bucket view with ``gradient_as_bucket_view``."""
        if self.gradient_as_bucket_view or self._as_list:  # a view, or a new tensor already
            param.grad = reduced
        elif param.grad is None or self.find_unused_parameters or param.grad.is_sparse:
            # A new tensor whether or not this replica held a gradient: the same
            # ops on every replica (XLA: identical graphs).
            param.grad = reduced.clone()
        else:  # every replica holds one (else backward raised): reuse its memory
            param.grad.copy_(reduced)

    # --- backward --------------------------------------------------------
    def _pack(self, bucket: Bucket) -> None:
        """Copy the bucket's gradients into ``bucket.flat`` (one ``cat``). Bucket
        views are there already; a ``None`` gradient (no replica used it) packs as
        zeros. A list bucket only collects its gradients in ``bucket.grads``."""
        # A sparse gradient (Embedding(sparse=True)) is reduced dense: the same mean as
        # upstream's sparse all-reduce (pytorch#19443), and SGD's update is the same.
        grads = [(p.grad.to_dense() if p.grad.is_sparse else p.grad) if p.grad is not None
                 else torch.zeros_like(p) for p in bucket.params]
        if bucket.flat is None:
            bucket.grads = grads
            return
        if not any(g is s for g, s in zip(grads, bucket.slots)):
            torch.cat([g.reshape(-1) for g in grads], out=bucket.flat)
            return
        for g, s in zip(grads, bucket.slots):
            if g is not s:
                s.copy_(g)

    def _reset(self) -> None:
        self._pending = [len(b.params) for b in self._buckets]
        self._ready: set[int] = set()
        self._fired: dict[int, int] = {}
        self._next, self._handles, self._queued = 0, [], False
        self._outer_task = None
        self._defer = self._reentrant  # once a reentrant backward is seen, reduce at the end

    def _queue_finalize(self) -> None:
        """Queue :meth:`_finalize_backward` on the backward now running (once per backward)
        and remember it: a hook firing in another one is a reentrant (nested) backward."""
        if not self._queued:
            self._queued = True
            self._outer_task = torch._C._current_graph_task_id()
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)

    @torch.no_grad()
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self.require_backward_grad_sync:
            return  # no_sync: the gradient just accumulates
        self._queue_finalize()
        if (not self.static_graph and not self._defer
                and torch._C._current_graph_task_id() != self._outer_task):
            self._defer = self._reentrant = True  # a nested backward: more firings may follow
        if self._defer and id(param) in self._ready:
            if self._bucket_of[id(param)] < self._next:
                raise RuntimeError(
                    f"parameter {self._names[id(param)]}'s gradient arrived again after its bucket "
                    "was all-reduced (a reentrant backward seen for the first time): pass "
                    "static_graph=True")
            return  # a further contribution, reduced at the end of backward
        if not self._firing_completes(param):
            return
        self._ready.add(id(param))
        self._pending[self._bucket_of[id(param)]] -= 1
        if not self.find_unused_parameters and not self._learning and not self._defer:
            self._launch_ready()

    @torch.no_grad()
    def _global_use_counts(self, params, used) -> list[float]:
        """How many replicas have ``used`` true for each of ``params`` (host floats:
        a ``None`` gradient is a host decision). Lazy runtimes (XLA) ``sync()``
        twice: before the all-reduce, to run this replica's own (rank-dependent)
        backward and zero fills, so the all-reduce's graph and the buckets' after
        it are the same everywhere; before the read, which would otherwise compile
        the collective per replica outside the step lock (``ddp_impl.runtime.xla``)."""
        used = torch.tensor([float(u) for u in used])
        self._sync()
        used = self.collectives.all_reduce_(used.to(params[0].device))
        self._sync()
        return used.cpu().tolist()

    def _wait_all(self) -> None:
        for h in self._handles:
            if h is not None:
                h.wait()

    def _sync(self) -> None:
        sync = getattr(self.collectives, "sync", None)
        if sync is not None:
            sync()

    @torch.no_grad()
    def _finalize_backward(self) -> None:
        """End of a synced backward: launch what is left in bucket order, wait, write grads."""
        try:
            if self._learning:
                self._hook_counts, self._learning = dict(self._fired), False
            skip = set()
            if self.find_unused_parameters:
                params = [p for b in self._buckets for p in b.params]
                used = [p.grad is not None for p in params]  # this backward's, or accumulated
                for p, u in zip(params, used):
                    if not u:  # locally unused: reduced as zeros (XLA: filled before the sync)
                        p.grad = torch.zeros_like(p)
                for p, n in zip(params, self._global_use_counts(params, used)):
                    if n == 0:  # no replica used it: untouched
                        p.grad = None
                        skip.add(id(p))
            elif len(self._ready) < len(self._bucket_of):
                self._wait_all()  # leave no collective in flight
                missing = [self._names[id(p)] for b in self._buckets for p in b.params
                           if id(p) not in self._ready]
                raise RuntimeError(
                    f"parameter(s) {missing} received no gradient in this backward; pass "
                    "find_unused_parameters=True if some parameters are unused (upstream DDP "
                    "errors too)")
            self._launch_ready(final=True)
            self._wait_all()
            for b in self._buckets:
                for p, g in zip(b.params, b.grads):
                    if id(p) not in skip:
                        self._set_grad(p, g)
        finally:
            self._reset()

    # --- nn.Module / DDP API ---------------------------------------------
    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync and self._queued:
            self._reset()  # an earlier backward raised before its end
        if self.broadcast_buffers and self.require_forward_param_sync:
            self._sync_buffers()
        out = self.module(*args, **kwargs)
        self.require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if self.require_forward_param_sync:
            out = self._sink_outputs(out)
        return out

    def _sink_outputs(self, out):
        """``out`` with every tensor that requires grad passed through :class:`_OutputSink`
        (one node): its backward queues the end-of-backward callback on the outermost backward.
        The output is walked as upstream walks it (:func:`ddp_impl.outputs.output_tensors`)."""
        at = [t for t in output_tensors(out) if t.requires_grad]
        if not at:
            return out
        sunk = iter(_OutputSink.apply(weakref.ref(self), *at))
        return output_tensors(out, lambda t: next(sunk) if t.requires_grad else t)

    def register_comm_hook(self, state, hook) -> None:
        """Reduce every bucket with ``hook(state, bucket)`` instead of the built-in average.

        Matches ``torch.nn.parallel.DistributedDataParallel.register_comm_hook``: ``bucket``
        is a :class:`GradBucket` (``buffer()``: the bucket's 1-D gradients, local; ``index()``,
        ``is_last()``, ``gradients()``, ``parameters()``, ``set_buffer()``); the hook returns a
        ``torch.futures.Future`` whose value is the *averaged* bucket (the hook divides; a new
        tensor or the buffer itself), which is copied into the gradients. torch's hooks
        (``allreduce_hook``, ``fp16_compress_hook``, ``bf16_compress_hook``, PowerSGD) run on
        torch.distributed, ``state`` being their process group or hook state.

        Raises:
            RuntimeError: a hook is already registered (upstream allows one).
            TypeError: ``hook`` is not callable.
            NotImplementedError: the buckets are reduced as lists of lazy tensors (the XLA
                collectives), where there is no bucket buffer and no torch.distributed group.
        """
        if not callable(hook):
            raise TypeError(f"comm hook must be callable, got {type(hook).__name__}")
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook can only be called once (as upstream)")
        if hasattr(self.collectives, "all_reduce_many"):  # lazy XLA collectives, no torch.distributed group
            raise NotImplementedError("comm hooks need bucket buffers on a torch.distributed group; "
                                      "this DDP reduces lazy XLA tensors through its XLA collectives")
        self._comm_hook, self._comm_state = hook, state

    @contextlib.contextmanager
    def no_sync(self):
        """Skip the gradient all-reduce inside the block; gradients accumulate
        (upstream's ``no_sync``: the next synced backward reduces them)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old
