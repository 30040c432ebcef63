"""The table of DDP implementations under test, and ``--ddp`` spec resolution.

A spec is a table key (``torch``, ``ref``, ...: :data:`ROWS`), ``mutant:<name>`` (see
:mod:`conformance.impls.mutants.catalog`), or ``package.module:obj`` for a user's own
implementation, where ``obj`` is

* a :class:`~conformance.impls.row.Strategy` (``conformance.Strategy``), or a zero-argument
  factory returning one: validated (:func:`validate_strategy`) and named by the spec;
* otherwise a DDP-like class (or callable taking the module), constructed like
  ``torch.nn.parallel.DistributedDataParallel``: ``Class(module, **ddp_kwargs)`` inside a
  replica whose torch.distributed default group (CPU runtime) or XLA runtime (PJRT) is
  initialised.

The module loads without torch: :data:`ROWS` names each row's factory by reference and
:data:`IMPLS` builds the rows on first use (the reference's row reads ``ddp_impl``, which
imports torch), so the CLI checks ``--ddp`` names against :data:`ROWS` before torch loads.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import fields, replace

from conformance.cases.row import resolve
from conformance.errors import split_list
from conformance.impls.row import (CLASS_FIELDS, DDP_KEYWORDS, DDP_METHOD_NAMES, INTERNAL_FIELDS, STRATEGY_KINDS, ImplSpecError,
                                   Strategy, refuse_keywords, torch_sync_bn, wrap_torch_ddp)
from conformance.worlds.runtimes import RUNTIMES, topologies
from conformance.impls.mutants.catalog import MUTANTS, unknown_mutant
from conformance.impls.mutants.claims import ref_ignores

#: The kit's implementation rows, in the order an error lists them: name -> the ``"module:attr"``
#: of the zero-argument function building its :class:`~conformance.impls.row.Strategy`
#: (:func:`conformance.cases.row.resolve`, on first use of :data:`IMPLS`).
ROWS = {
    "torch": "conformance.impls.builtin:torch_row",
    "ref": "conformance.impls.builtin:ref_row",
    "xla_recipe": "conformance.impls.builtin:xla_recipe_row",
    "torch_compile": "conformance.impls.torch_paths:torch_compile_row",
    "torch_compiled_autograd": "conformance.impls.torch_paths:compiled_autograd_row",
    "replicate": "conformance.impls.torch_paths:replicate_row",
    "zero": "conformance.impls.torch_paths:zero_row",
    "fsdp2": "conformance.impls.torch_paths:fsdp2_row",
    "fsdp2_no_reshard": "conformance.impls.torch_paths:fsdp2_no_reshard_row",
    "xla_spmd": "conformance.impls.xla_paths:spmd_row",
    "xla_fsdpv2": "conformance.impls.xla_paths:fsdpv2_row",
    "xla_fsdp": "conformance.impls.xla_paths:xla_fsdp_row",
    "fairscale": "conformance.impls.engines.fairscale:row",
    "accelerate": "conformance.impls.engines.accelerate:row",
    "lightning_fabric": "conformance.impls.engines.lightning:row",
    "deepspeed_zero0": "conformance.impls.engines.deepspeed:zero0_row",
    "deepspeed_zero1": "conformance.impls.engines.deepspeed:zero1_row",
    "deepspeed_zero2": "conformance.impls.engines.deepspeed:zero2_row",
    "deepspeed_zero3": "conformance.impls.engines.deepspeed:zero3_row",
    "torchft": "conformance.impls.engines.torchft:row",
    "megatron_core": "conformance.impls.engines.unbuildable:megatron_row",
    "horovod": "conformance.impls.engines.unbuildable:horovod_row",
}

# Upstream torch.nn.parallel.DistributedDataParallel over the ``xla`` process
# group, in the PJRT topology the kit runs (1 process x W replica threads);
# tests/test_pjrt_runtime.py (test_torch_ddp_on_pjrt_*) keeps this text true.
TORCH_DDP_ON_PJRT = (
    "unsupported topology: DDP() raises IndexError: list index out of range in "
    "ProcessGroupXla.allgather (_verify_param_shape_across_processes): with 1 process x W replica "
    "threads the process-global xla group (ddp_impl.runtime.xla.init_pjrt_process_group) has 1 rank while "
    "xm.all_gather returns W rows; initialised per thread with xla:// instead, the constructor's "
    "all-gathers compile per thread and XLA aborts the host (Termination timeout for all gather, "
    "1 of W arrived)")


def unknown_impl(spec: str) -> str:
    """The one line for an implementation name that is no row (nor ``all``, a mutant, a module)."""
    return (f"unknown DDP implementation {spec!r}; use one of "
            f"{', '.join(ROWS)}, all, mutant:<name> or package.module:obj")


def _ref_kwargs(ctx, kwargs) -> dict:
    """The reference DDP's keywords: the replica's collectives, unless the case passes a
    ``process_group`` - a torch.distributed group (the reference then runs its collectives on
    it) or, on PJRT, collectives over XLA replica groups (passed as ``collectives``)."""
    pg = kwargs.get("process_group")
    if pg is None:
        return dict(kwargs, collectives=ctx.collectives)
    if callable(getattr(pg, "all_reduce_", None)):
        return dict({k: v for k, v in kwargs.items() if k != "process_group"}, collectives=pg)
    return dict(kwargs)


def _wrap_ref(module, ctx, kwargs):
    return resolve("ddp_impl:DistributedDataParallel")(module, **_ref_kwargs(ctx, kwargs))


def _ref_sync_bn(module, ctx):
    return resolve("ddp_impl.sync_batchnorm:SyncBatchNorm").convert_sync_batchnorm(module, ctx.collectives)


# --- torch_xla's own data-parallel recipe (PJRT only) ------------------------
# No wrapper module: the model itself is returned. A keyword the recipe has no
# counterpart for is refused with TypeError (the constructor contract), which the
# kit's wrap reports as unsupported.
XLA_RECIPE_KWARGS = frozenset({"broadcast_buffers"})


def _xla_broadcast(tensors):
    """``xm.collective_broadcast`` from replica 0 - the body of
    ``xm.broadcast_master_param`` without its trailing ``torch_xla.sync()``,
    which can deadlock with replica threads (docs/runtimes/pjrt.md, cause 3); the
    kit runs ``ctx.mark_step()`` after construction instead. It multiplies
    by a 1/0 *device* scalar and all-reduces (layout pinned, as
    ``xm.reduce_gradients``), so every replica's graph is the same."""
    import torch_xla.core.xla_model as xm
    if tensors:
        xm.collective_broadcast(list(tensors), root_ordinal=0)


def _wrap_xla_recipe(module, ctx, kwargs):
    refuse_keywords("xla_recipe", kwargs, XLA_RECIPE_KWARGS)
    broadcast_buffers = kwargs.get("broadcast_buffers", True)
    _xla_broadcast(list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []))
    if broadcast_buffers and any(True for _ in module.buffers()):
        # Upstream DDP's buffer semantics: rank 0's buffers before a forward that follows a
        # grad-enabled one, or the first (DistributedDataParallel._post_forward:
        # require_forward_param_sync; the recipe has no no_sync). Broadcasting only at the start
        # fails buffer_parity from step 2; broadcasting before every grad-enabled forward fails
        # scenario.loop after a train-mode no_grad forward.
        follows_synced = [True]

        def sync_buffers(mod, args):
            import torch
            if follows_synced[0]:
                _xla_broadcast(list(mod.buffers()))
            follows_synced[0] = torch.is_grad_enabled()
        module.register_forward_pre_hook(sync_buffers)
    return module


def _xla_recipe_after_backward(model, optimizer, ctx):
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    # reduce_gradients scales by 1 / xr.world_size(), a process-wide cache that
    # reads 1 if it was first filled before replication was set up: refuse then.
    if xr.world_size() != ctx.world_size:
        raise RuntimeError(f"torch_xla.runtime.world_size() is {xr.world_size()}, the world has "
                           f"{ctx.world_size} replicas: xm.reduce_gradients would not average")
    xm.reduce_gradients(optimizer)  # all_reduce(SUM, grads, scale=1/W, pin_layout=True)


def torch_row() -> Strategy:
    """The ``torch`` row: upstream ``torch.nn.parallel.DistributedDataParallel``."""
    return Strategy("torch", "torch.nn.parallel.DistributedDataParallel", wrap_torch_ddp,
                    sync_batchnorm=torch_sync_bn, unsupported={"pjrt": TORCH_DDP_ON_PJRT})


def ref_row() -> Strategy:
    """The ``ref`` row: the kit's reference DDP (``ddp_impl``)."""
    return Strategy("ref", "ddp_impl.DistributedDataParallel (the kit's reference DDP)", _wrap_ref,
                    sync_batchnorm=_ref_sync_bn, ignores=ref_ignores())


def xla_recipe_row() -> Strategy:
    """The ``xla_recipe`` row: torch_xla's data-parallel recipe, no wrapper (PJRT only)."""
    return Strategy("xla_recipe", "torch_xla's data-parallel recipe: no wrapper, parameters (and buffers) "
                    "broadcast from replica 0, xm.reduce_gradients(optimizer) before optimizer.step()",
                    _wrap_xla_recipe, after_backward=_xla_recipe_after_backward,
                    not_transparent={"module_hooks": "no wrapper: the buffer broadcast before a forward is a "
                                                     "forward pre-hook registered on the module itself"},
                    unsupported={"cpu": "needs the XLA runtime (torch_xla: xm.collective_broadcast, "
                                        "xm.reduce_gradients); run it with --runtime pjrt"})


# --- the public contract, checked -------------------------------------------

_CALLABLES = ("after_backward", "optimizer_step", "make_optimizer", "optimizer_state_dict",
              "forward_backward", "sync_batchnorm", "backward", "zero_grad", "before_forward", "after_step",
              "gather_grads", "gather_params")


def _reason_problem(value) -> str | None:
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        return f"a reason must be a non-empty one-line str, got {value!r:.60}"
    return None


def _mapping_problem(value, keys, what) -> str | None:
    if not isinstance(value, dict):
        return f"must be a dict {{{what}: reason}}, got {type(value).__name__}"
    for k, v in value.items():
        if k not in keys:
            return f"unknown {what} {k!r}; known: {', '.join(keys)}"
        problem = _reason_problem(v)
        if problem:
            return f"[{k!r}]: {problem}"
    return None


def strategy_problem(row: Strategy) -> tuple[str, str] | None:
    """``(field, problem)`` for the first field of ``row`` outside the public contract
    (:class:`~conformance.impls.row.Strategy`), or ``None``. Checks types, the names a
    field may use (runtimes, kinds, DDP keywords and methods, topologies) and that the
    internal fields keep their defaults (a catalog mutant's row is not checked)."""
    if not isinstance(row.name, str):
        return "name", f"must be a str, got {type(row.name).__name__}"
    if not isinstance(row.description, str) or "\n" in row.description:
        return "description", "must be a one-line str"
    if not callable(row.wrap):
        return "wrap", f"must be callable wrap(module, ctx, ddp_kwargs) -> module, got {row.wrap!r:.60}"
    for name in _CALLABLES:
        value = getattr(row, name)
        if value is not None and not callable(value):
            return name, f"must be callable or None, got {value!r:.60}"
    if not isinstance(row.ignores, (frozenset, set, tuple, list)) or isinstance(row.ignores, str):
        return "ignores", f"must be a frozenset of DDP keywords, got {type(row.ignores).__name__}"
    unknown = [k for k in row.ignores if k not in DDP_KEYWORDS]
    if unknown:
        return "ignores", f"unknown DDP keyword(s) {unknown}; known: {', '.join(DDP_KEYWORDS)}"
    for name, keys, what in (("unsupported", tuple(RUNTIMES), "runtime"),
                             ("unsupported_kinds", STRATEGY_KINDS, "kind"),
                             ("unsupported_features", DDP_KEYWORDS + DDP_METHOD_NAMES, "DDP keyword or method")):
        problem = _mapping_problem(getattr(row, name), keys, what)
        if problem:
            return name, problem
    for name in ("holds_copies", "optimizer_first"):
        if not isinstance(getattr(row, name), bool):
            return name, f"must be a bool, got {type(getattr(row, name)).__name__}"
    if not isinstance(row.grad_attribute, str) or not row.grad_attribute.isidentifier():
        return "grad_attribute", f"must be an attribute name (str), got {row.grad_attribute!r:.60}"
    if not isinstance(row.not_transparent, dict):
        return "not_transparent", f"must be a dict {{observable: reason}}, got {type(row.not_transparent).__name__}"
    if not isinstance(row.holds_copies, bool):
        return "holds_copies", f"must be a bool, got {type(row.holds_copies).__name__}"
    if not isinstance(row.unavailable, str) or "\n" in row.unavailable:
        return "unavailable", f"must be a one-line str, got {row.unavailable!r:.60}"
    problem = _reason_problem(row.no_copies_reason)
    if problem:
        return "no_copies_reason", problem
    if not isinstance(row.topology, dict):
        return "topology", f"must be a dict {{runtime: topology}}, got {type(row.topology).__name__}"
    for runtime, topology in row.topology.items():
        known = topologies(runtime)  # the runtime adapter's (empty: an unknown runtime)
        if not known:
            having = ", ".join(repr(r) for r in RUNTIMES if topologies(r))
            return "topology", f"runtime {runtime!r} has no topologies (only {having} does)"
        if topology not in known:
            return "topology", f"unknown topology {topology!r}; known: {', '.join(known)}"
    if row.mutant:
        return "mutant", "is internal (the catalog's mutants); leave it False"
    if row.shard_rank is not _DEFAULT_SHARD_RANK:
        return "shard_rank", "is internal (the catalog's mutants); the kit decides which shard a replica trains on"
    return None


_DEFAULT_SHARD_RANK = {f.name: f.default for f in fields(Strategy)}["shard_rank"]
assert set(INTERNAL_FIELDS) == {"shard_rank", "mutant"}


def validate_strategy(row: Strategy, where: str = "") -> Strategy:
    """Return ``row`` if it keeps to the public contract (:func:`strategy_problem`).

    Raises:
        ImplSpecError: one line, ``<where>: Strategy.<field> <problem>``.
    """
    problem = strategy_problem(row)
    if problem:
        field_name, what = problem
        raise ImplSpecError(f"{where + ': ' if where else ''}Strategy.{field_name} {what}")
    return row


_IMPLS: dict = {}  # name -> Strategy: the kit's rows, built once per process


def impls() -> dict[str, Strategy]:
    """The kit's rows by name, in :data:`ROWS` order: each factory's row, built on first call
    and checked to keep to the public contract (also :data:`IMPLS`).

    Raises:
        ImplSpecError: a row outside the contract (named), or a factory whose row has another name.
    """
    if not _IMPLS:
        built = {}
        for name, ref in ROWS.items():
            row = resolve(ref)()
            if row.name != name:
                raise ImplSpecError(f"row {name!r}: {ref} builds a row named {row.name!r}")
            built[name] = validate_strategy(row, f"row {name!r}")
        _IMPLS.update(built)
    return _IMPLS


def __getattr__(name):
    if name == "IMPLS":  # the rows, built on first use (PEP 562)
        return impls()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_USER_ROWS: dict = {}  # spec -> Strategy: a user's factory runs once per process


def _takes_no_arguments(obj) -> bool:
    try:
        inspect.signature(obj).bind()
    except (TypeError, ValueError):
        return False
    return True


def _user_row(spec: str, attr: str, obj) -> Strategy:
    """The row of a user's ``package.module:obj`` (see the module docstring)."""
    where = f"--ddp {spec!r}"
    if not isinstance(obj, (Strategy, type)) and callable(obj) and _takes_no_arguments(obj):
        try:
            made = obj()
        except Exception as exc:  # the user's factory failing is the spec failing
            raise ImplSpecError(f"{where}: {attr}() raised {type(exc).__name__}: {exc}") from None
        if not isinstance(made, Strategy):
            raise ImplSpecError(f"{where}: the zero-argument factory {attr}() returned "
                                f"{type(made).__name__}, not a conformance.Strategy")
        obj = made
    if isinstance(obj, Strategy):
        validate_strategy(obj, where)
        return replace(obj, name=spec, description=obj.description or f"user strategy {spec}")
    if not callable(obj):
        raise ImplSpecError(f"{where}: {attr!r} is a {type(obj).__name__}, neither a DDP-like class "
                            "nor a conformance.Strategy (or a zero-argument factory of one)")
    return validate_strategy(_class_row(spec, obj), where)


def _class_row(spec: str, obj) -> Strategy:
    """The row of a DDP-like class (or callable): ``obj(module, **ddp_kwargs)`` (``obj(module,
    optimizer, **ddp_kwargs)`` where it declares ``optimizer_first``), with the fields of
    :data:`~conformance.impls.row.CLASS_FIELDS` it declares as class attributes: values, and
    callables as ``staticmethod`` (a plain method is the wrapper's own, e.g. ``zero_grad``)."""
    declared = {}
    for klass in reversed(getattr(obj, "__mro__", ())):  # a subclass's declaration wins
        if klass.__module__.split(".")[0] in ("torch", "builtins"):  # nn.Module.zero_grad is no declaration
            continue
        for f in CLASS_FIELDS:
            value = vars(klass).get(f)
            if isinstance(value, staticmethod):
                declared[f] = value.__func__
            elif value is not None and not callable(value):
                declared[f] = value
    if isinstance(declared.get("ignores"), (set, list, tuple)):
        declared["ignores"] = frozenset(declared["ignores"])
    if declared.get("optimizer_first") is True:
        def wrap(module, ctx, kwargs, optimizer):
            return obj(module, optimizer, **kwargs)
    else:
        def wrap(module, ctx, kwargs):
            return obj(module, **kwargs)
    return Strategy(spec, f"user implementation {spec}", wrap, **declared)


def resolve_impl(spec: str) -> Strategy:
    """Return the :class:`~conformance.impls.row.Strategy` for ``spec`` (module docstring).

    Raises:
        ImplSpecError: unknown name, unknown mutant, a module that does not import, an
            attribute that is missing, neither callable nor a Strategy, a factory that
            raises or returns something else, or a Strategy with a bad field (named).
    """
    spec = spec.strip()
    if spec.startswith("mutant:"):
        return mutant_impl(spec[len("mutant:"):])
    if spec in ROWS:
        return impls()[spec]
    if spec in _USER_ROWS:
        return _USER_ROWS[spec]
    if ":" not in spec:
        raise ImplSpecError(unknown_impl(spec))
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # any import-time error is the user's spec failing
        raise ImplSpecError(f"--ddp {spec!r}: cannot import {mod_name!r}: "
                            f"{type(exc).__name__}: {exc}") from None
    if not hasattr(mod, attr):
        raise ImplSpecError(f"--ddp {spec!r}: module {mod_name!r} has no callable {attr!r} "
                            "(a DDP-like class, a conformance.Strategy or a factory of one)")
    _USER_ROWS[spec] = row = _user_row(spec, attr, getattr(mod, attr))
    return row


def inherits_from(spec: str) -> str | None:
    """The shipped row whose code a user's ``--ddp module:Class`` inherits: ``"torch"`` for a
    subclass of ``torch.nn.parallel.DistributedDataParallel`` (torch's findings are then the
    class's own defects too), else None (a built-in row, a mutant, a factory, a Strategy)."""
    row = resolve_impl(spec)
    if spec in ROWS or row.mutant or ":" not in spec:
        return None
    mod_name, _, attr = spec.strip().partition(":")
    obj = getattr(importlib.import_module(mod_name), attr, None)
    from torch.nn.parallel import DistributedDataParallel
    return "torch" if isinstance(obj, type) and issubclass(obj, DistributedDataParallel) else None


def parse_impls(specs: str, runtime: str | None = None) -> list[Strategy]:
    """Resolve a comma-separated list of specs (see :func:`resolve_impl`). ``all`` names
    every row of the table that runs on ``runtime`` (every row when ``runtime`` is None)."""
    names = split_list(specs)
    if "all" in names:
        rows = [n for n, row in impls().items() if runtime is None or runtime not in row.unsupported]
        names = [n for n in names if n != "all"] + [n for n in rows if n not in names]
    if not names:
        raise ImplSpecError("--ddp is empty; name at least one implementation")
    return [resolve_impl(n) for n in names]


def mutant_impl(name: str) -> Strategy:
    """The :class:`Strategy` row of catalog mutant ``name`` (``conformance.impls.mutants.catalog``).

    Raises:
        ImplSpecError: unknown mutant.
    """
    if name not in MUTANTS:
        raise ImplSpecError(unknown_mutant(name))
    m = MUTANTS[name]
    if m.shipped_path is not None:  # a shipped path's row (conformance/impls/torch_paths.py) with one fault
        return replace(resolve(m.shipped_path)(), name=f"mutant:{name}", description=m.description, mutant=True)

    def wrap(module, ctx, kwargs):
        cls = resolve(m.ddp_class)
        if m.torch_based:
            return cls(module, **kwargs)
        return cls(module, **_ref_kwargs(ctx, kwargs))
    extra = {"shard_rank": resolve(m.shard_rank)} if m.shard_rank else {}
    if m.sync_bn:
        extra["sync_batchnorm"] = lambda module, ctx: resolve(m.sync_bn).convert_sync_batchnorm(module, ctx.collectives)
    elif not m.torch_based:
        extra["sync_batchnorm"] = _ref_sync_bn
    if m.torch_based:  # torch.distributed underneath: cannot run where torch's DDP cannot
        extra["unsupported"] = m.unsupported or {"pjrt": TORCH_DDP_ON_PJRT}
    else:
        extra["ignores"] = ref_ignores() - frozenset(m.honours)
        if m.unsupported:  # a fault that does not reach a runtime's step
            extra["unsupported"] = m.unsupported
    return Strategy(f"mutant:{name}", m.description, wrap, mutant=True, **extra)
