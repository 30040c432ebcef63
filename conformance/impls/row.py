"""The strategy row type - the public :class:`Strategy` contract (``conformance.Strategy``) - and
the two torch helpers rows share. A leaf module: ``impls.builtin``, ``impls.torch_paths``,
``impls.xla_paths`` and ``impls.mutants`` import it, it imports none of them (nor torch at import
time); of the cases it reads only the kinds' registry (``conformance.cases.kinds``, a leaf).
Every row of the kit is a :class:`Strategy` using only its public fields; docs/strategies.md
shows user strategies end to end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from conformance.cases.kinds import REGISTRY


class ImplSpecError(ValueError):
    """A ``--ddp`` spec that names nothing usable, or a :class:`Strategy` with a bad field;
    ``str(exc)`` is one line (naming the field)."""


def _replica_rank(ctx):
    return ctx.rank


#: torch DDP constructor keywords (``torch.nn.parallel.DistributedDataParallel.__init__``,
#: torch 2.13, a superset of 2.9's): the names ``Strategy.ignores`` may list.
DDP_KEYWORDS = ("device_ids", "output_device", "dim", "broadcast_buffers", "init_sync", "process_group",
                "bucket_cap_mb", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view",
                "static_graph", "delay_all_reduce_named_params", "param_to_hook_all_reduce",
                "mixed_precision", "device_mesh", "skip_all_reduce_unused_params", "bucket_cap_mb_list",
                "batched_grad_copy", "forward_sync_buffers")
#: DDP methods a case may require (``conformance.cases.shared.step.DDP_METHODS``).
DDP_METHOD_NAMES = ("join", "no_sync", "register_comm_hook")
#: Case kinds a strategy serves: the registry's kinds whose rows build a model through it
#: (``needs_impl``; not ``invariant``, which checks rank bindings, nor ``collective``, which
#: runs the backend's ops): the keys ``Strategy.unsupported_kinds`` may use.
STRATEGY_KINDS = tuple(name for name, line in REGISTRY.items() if line.needs_impl)
#: Fields of :class:`Strategy` that are not part of the public contract (the catalog's
#: mutants use them); a user's strategy leaving them at their defaults is checked at resolution.
INTERNAL_FIELDS = ("shard_rank", "mutant")


@dataclass(frozen=True)
class Strategy:
    """How one data-parallel implementation trains: the public contract of ``--ddp mod:obj``.

    The kit builds the model on every replica, calls :attr:`wrap`, builds the optimizer
    (:attr:`make_optimizer`; before :attr:`wrap` with :attr:`optimizer_first`), and for every
    step runs :attr:`zero_grad`, :attr:`before_forward`, forward on the replica's shard of the
    global batch, ``mse_loss``, :attr:`backward`, :attr:`after_backward`, then
    :attr:`optimizer_step` (default ``optimizer.step()``), :attr:`after_step` and
    ``ctx.mark_step()`` - in every case kind (``conformance.cases.shared.step``). After construction and after
    every step it reads parameters, buffers and the optimizer state (:attr:`optimizer_state_dict`)
    back and compares them with the same steps on one CPU device with
    ``torch.nn.parallel.DistributedDataParallel``'s semantics (gradients averaged over
    replicas; rank 0's parameters and buffers after construction; with
    ``broadcast_buffers=True`` rank 0's buffers before every forward) and with
    ``torch.optim.SGD``.

    Every callable receives ``ctx``, the replica's
    :class:`conformance.worlds.runtimes.base.ReplicaContext`. A strategy may read
    ``ctx.rank`` (int, ``0 <= rank < world_size``), ``ctx.world_size`` (int, replicas),
    ``ctx.device`` (``torch.device``: ``cpu`` on the CPU runtime, ``xla:<rank>`` on PJRT),
    ``ctx.runtime`` (``"cpu"``, ``"pjrt"``, ``"pjrt_spmd"``), ``ctx.mark_step()`` (XLA: cut and
    run the lazy graph; use it, never ``torch_xla.sync()``, in the thread topology) and, in
    the ``spmd`` topology, ``ctx.extra["mesh_devices"]`` (int, devices of the mesh; there
    ``rank`` is 0 and ``world_size`` 1). Where a replica runs: ``cpu`` - its own process,
    the torch.distributed default group (gloo) initialised over the world; ``pjrt`` - a
    thread of one process, the XLA runtime replicated over W PJRT CPU devices (``xm``
    collectives work; every replica must compile the same graph); ``spmd`` - one program,
    ``xr.use_spmd()`` set, no replicas. Anything a callable raises fails the case, except
    ``conformance.errors.Unsupported(reason)`` (the case is ``unsupported`` with
    ``reason``) and ``TypeError`` from :attr:`wrap` naming a keyword it was given.

    Public fields (stable; docs/strategies.md):

    Attributes:
        name: the row's name. A user's strategy is named by its ``--ddp`` spec (this field
            is replaced), so verdicts carry the spec.
        description: one line for reports (a user's empty one reads ``user strategy <spec>``).
        wrap: ``wrap(module, ctx, ddp_kwargs) -> torch.nn.Module``, the model the kit trains.
            Called once per model the kit builds on a replica (a training run builds one,
            and again after a checkpoint reload; a ``task`` case or a property example one,
            with no keywords for the properties), after ``module``
            was moved to ``ctx.device`` and built from the replica's *own* seed (replicas
            differ: like DDP's construction, ``wrap`` must give every replica rank 0's
            parameters and, with ``broadcast_buffers``, buffers). Return ``module`` itself
            (no wrapper), or a wrapper whose ``forward`` the kit calls, whose
            ``parameters()`` go to the optimizer and whose ``state_dict()`` the checkpoint
            cases save. The kit reads parameters from ``module`` (``named_parameters()``
            order); a sharded parameter must be a DTensor (read with ``full_tensor()``, a
            collective) or an XLA SPMD tensor (``.cpu()`` gathers). ``ddp_kwargs``: dict of
            DDP keywords (``broadcast_buffers: bool`` from training runs, tasks and scenarios, none
            from the properties: default it to True, as DDP does; per model or case
            ``bucket_cap_mb: float`` (MiB), ``find_unused_parameters``,
            ``gradient_as_bucket_view``, ``static_graph``: bool; ``feature.subgroups``:
            ``process_group``, this replica's ``torch.distributed`` group on CPU, on PJRT an
            ``ddp_impl.runtime.xla.XlaCollectives`` over XLA replica groups). Raise ``TypeError`` naming a
            keyword you do not implement (the case is ``unsupported``); accept and list in
            :attr:`ignores` one you take but do not honour. The kit runs ``ctx.mark_step()``
            before it reads anything back (on XLA the construction's collectives run there).
        after_backward: ``f(model, optimizer, ctx) -> None`` or ``None``; ``model`` is what
            :attr:`wrap` returned, ``optimizer`` the run's (:attr:`make_optimizer`'s, else
            ``torch.optim.SGD``; a scenario's SGD, Adam or AdamW). Run once
            per optimizer step after the (last micro-step's) backward, before the step (e.g.
            ``xm.reduce_gradients(optimizer)``). The ``property`` cases call it after their
            backward (with a ``torch.optim.SGD(lr=0)``) and then read the gradients: a
            strategy whose gradients are not the replicas' mean (float32, parameter shapes)
            once it returned must declare ``unsupported_kinds["property"]``.
        optimizer_step: ``f(model, optimizer, ctx) -> None`` or ``None``; replaces
            ``optimizer.step()`` in the training loop and the scenarios (e.g.
            ``xm.optimizer_step(optimizer)``: ``reduce_gradients`` then ``step``). It must
            leave every replica's parameters updated as ``optimizer.step()`` on the averaged
            gradient would; the kit runs ``ctx.mark_step()`` after it. ``None``:
            ``optimizer.step()``.
        make_optimizer: ``f(params, run) -> torch.optim.Optimizer`` or ``None`` (then
            ``torch.optim.SGD(params, lr=run.lr, momentum=run.momentum)``). ``params``: the
            wrapped model's ``parameters()``; ``run.lr`` (float), ``run.momentum`` (float,
            0.0 or 0.9). The result must update as ``torch.optim.SGD(lr, momentum)`` does
            (dampening 0, no Nesterov, no weight decay) and offer ``zero_grad(set_to_none=True)``,
            ``step()``, ``param_groups`` and ``load_state_dict(sd)`` of the *full* state dict
            :attr:`optimizer_state_dict` returned (checkpoint cases). Scenarios (which draw
            their own SGD/Adam/AdamW) are ``unsupported`` for a strategy that sets it.
        optimizer_state_dict: ``f(optimizer, ctx) -> dict`` or ``None`` (then
            ``optimizer.state_dict()``): the full, unsharded state in
            ``torch.optim.Optimizer.state_dict()`` form, ``{"state": {i: {"momentum_buffer":
            Tensor}}, "param_groups": [...]}`` with ``i`` the parameter's index in
            ``param_groups`` and each tensor shaped like its parameter, equal on every
            replica. Called on every replica at the same points (after every step, at
            checkpoints): it may run collectives. Compared with ``torch.optim.SGD``'s state
            tensor by tensor (as float64, in index order).
        forward_backward: ``f(model, inputs, loss_fn) -> Tensor`` or ``None``: one call
            running forward on ``inputs`` (the local batch, float32 ``[B_local, ...]`` on
            ``ctx.device``), ``loss = loss_fn(output)`` (a 0-d float32 tensor) and
            ``loss.backward()``; returns ``loss`` (e.g. one compiled step). ``None``: the
            loop calls them in turn.
        sync_batchnorm: ``f(module, ctx) -> module`` or ``None``: convert BatchNorm layers
            to the strategy's SyncBatchNorm (statistics over the global batch), before
            :attr:`wrap`, for ``feature.sync_batchnorm``. ``None``: that case is unsupported.
        ignores: DDP keywords (:data:`DDP_KEYWORDS`) :attr:`wrap` accepts but does not
            honour: a case that *requires* one is ``unsupported``, one that merely passes it
            (``parity.mlp``'s ``bucket_cap_mb``) runs.
        unsupported_features: ``{feature: reason}``, feature a DDP keyword
            (:data:`DDP_KEYWORDS`) or method (:data:`DDP_METHOD_NAMES`): a case requiring it
            is ``unsupported`` with ``reason``. A missing method is found anyway; this names why.
        unsupported: ``{runtime: reason}``: every case on that runtime (``cpu``, ``pjrt``,
            ``xrt``) is ``unsupported`` with ``reason``.
        unsupported_kinds: ``{kind: reason}``, kind one of :data:`STRATEGY_KINDS`: cases of
            that kind are ``unsupported`` with ``reason``.
        holds_copies: every replica holds a full copy of the parameters (replica agreement -
            bit-identical to replica 0 - is checked). ``False`` (sharded parameters, one SPMD
            program): agreement is ``skip`` with :attr:`no_copies_reason`.
        no_copies_reason: why, when :attr:`holds_copies` is ``False`` (one line).
        topology: ``{runtime: topology}``: how the strategy maps ``runtime`` onto devices;
            absent: one replica per device. ``{"pjrt": "spmd"}``: one program over a
            W-device mesh (the runtime adapter's ``topologies``), one context
            training on the whole global batch; :attr:`wrap` must shard it (and should fail
            a step whose input stayed replicated, see ``conformance/impls/xla_paths.py``).

        optimizer_first: the optimizer is built before the wrapper, as fairscale's
            ``ShardedDataParallel(module, OSS(...))``, DeepSpeed's ``initialize`` and accelerate's
            ``prepare`` take it: the kit builds the case's optimizer over ``module.parameters()``
            and calls ``wrap(module, ctx, ddp_kwargs, optimizer)``, which returns the model or
            ``(model, optimizer)`` (the engine's optimizer, e.g. OSS built from the kit's, which
            the steps then use: it must update as the kit's would).
        backward: ``f(model, loss, optimizer, ctx) -> None`` or ``None`` (``loss.backward()``):
            the engine's backward (``engine.backward(loss)``, ``accelerator.backward(loss)``).
        zero_grad: ``f(model, optimizer, ctx) -> None`` or ``None``
            (``optimizer.zero_grad(set_to_none)``): clear the gradients before a step's first
            forward (``engine.zero_grad()``).
        before_forward: ``f(model, optimizer, ctx) -> None`` or ``None``: run once per
            optimizer step before its first forward (e.g. sync or reset the engine's buffers).
        after_step: ``f(model, optimizer, ctx) -> None`` or ``None``: run after every
            optimizer step (:attr:`optimizer_step` or ``optimizer.step()``), before anything is
            read back (reset grad buffers, zero the engine's own state).
        grad_attribute: where a parameter keeps its synchronised gradient once
            :attr:`after_backward` returned (``"grad"``; ``"main_grad"`` for Megatron-style
            engines). Read by the gradient properties and the feature tasks.
        gather_grads: ``f(module, model, optimizer, ctx) -> list[Tensor | None]`` or ``None``:
            the synchronised gradients of ``module.parameters()`` (in that order, full shape,
            equal on every replica) where the engine shards them to owner ranks: a collective
            every replica calls (e.g. a broadcast from each gradient's owner).
            Loss unscaling and clipping between backward and step edit ``.grad``: a scenario
            drawing them is ``unsupported`` for a strategy with another ``grad_attribute`` or
            a ``gather_grads``.
        gather_params: ``f(module, model, optimizer, ctx) -> context manager`` or ``None``:
            where the engine partitions parameters in place (DeepSpeed ZeRO-3), a context inside
            which every parameter of ``module`` holds its full value (shape, dtype, data; equal
            on every replica), released on exit: entering and leaving are collectives every
            replica runs. The kit reads parameters (their values and their layout) inside it.
        unavailable: why the implementation cannot run on this machine at all (its package is
            not installed, it needs a device this machine lacks): one line; every case is
            ``skip`` with it. ``""``: it can run.
        not_transparent: ``{observable: reason}``, observables of
            :data:`conformance.cases.shared.transparency.OBSERVABLES` the strategy is documented to
            change (FSDP replaces parameters with sharded ones): the ``transparency`` check
            leaves them out and says why; every other one must be what the module, the
            optimizer, the RNG and the loop would see without the DDP.

    Internal fields (:data:`INTERNAL_FIELDS`; the catalog's mutants set them, a user's
    strategy must not): ``shard_rank(ctx) -> int``, which shard of the global batch a
    replica trains on (its rank); ``mutant``, True for a deliberately broken row.
    """

    name: str = ""
    description: str = ""
    wrap: Callable | None = None
    after_backward: Callable | None = None
    optimizer_step: Callable | None = None
    unsupported: dict = field(default_factory=dict)
    shard_rank: Callable = _replica_rank
    mutant: bool = False
    sync_batchnorm: Callable | None = None
    ignores: frozenset = frozenset()
    make_optimizer: Callable | None = None
    optimizer_state_dict: Callable | None = None
    forward_backward: Callable | None = None
    unsupported_features: dict = field(default_factory=dict)
    holds_copies: bool = True
    no_copies_reason: str = ("shards parameters over replicas (no copies to agree); the kit reads "
                             "gathered full tensors")
    topology: dict = field(default_factory=dict)
    unsupported_kinds: dict = field(default_factory=dict)
    not_transparent: dict = field(default_factory=dict)
    optimizer_first: bool = False
    backward: Callable | None = None
    zero_grad: Callable | None = None
    before_forward: Callable | None = None
    after_step: Callable | None = None
    grad_attribute: str = "grad"
    gather_grads: Callable | None = None
    gather_params: Callable | None = None
    unavailable: str = ""

#: The step protocol's fields (docs/strategies.md, "The step protocol"): a plain class given as
#: ``--ddp mod:Class`` may declare them, and the declarative fields, as class attributes.
PROTOCOL_FIELDS = ("optimizer_first", "backward", "zero_grad", "before_forward", "after_step",
                   "grad_attribute", "gather_grads", "gather_params")
#: Fields a plain class may declare as class attributes (:data:`PROTOCOL_FIELDS` and these); a
#: callable one is called as the Strategy's field is (a ``staticmethod`` on the class).
CLASS_FIELDS = ("ignores", "sync_batchnorm", "not_transparent", "unsupported", "unsupported_kinds",
                "unsupported_features", "after_backward", "optimizer_step", "make_optimizer",
                "optimizer_state_dict") + PROTOCOL_FIELDS


def refuse_keywords(row: str, kwargs: dict, accepted) -> None:
    """The constructor contract for rows without DDP's full signature: a keyword
    outside ``accepted`` raises ``TypeError`` (``conformance.cases.shared.step.wrap`` reports the case unsupported)."""
    other = sorted(k for k in kwargs if k not in accepted)
    if other:
        raise TypeError(f"{row} has no counterpart for keyword(s) {', '.join(other)}")


def wrap_torch_ddp(module, ctx, kwargs):
    import torch.nn.parallel
    return torch.nn.parallel.DistributedDataParallel(module, **kwargs)


def torch_sync_bn(module, ctx):
    import torch
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
