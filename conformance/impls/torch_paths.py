"""Implementation rows for PyTorch's shipped data-parallel paths (CPU runtime).

Each row is a zero-argument factory that :data:`conformance.impls.builtin.ROWS` names. Every row
runs on the CPU runtime (gloo); on other runtimes it is ``unsupported`` with the reason. Semantics mirrored, per row:

* ``torch_compile`` - ``torch.compile(DistributedDataParallel(m))`` with dynamo's
  default ``optimize_ddp`` (DDPOptimizer: the graph is split at bucket boundaries,
  the C++ reducer all-reduces), ``torch/_dynamo/backends/distributed.py``;
* ``torch_compiled_autograd`` - "compiled DDP": DDP built under
  ``torch._dynamo.config.optimize_ddp = "python_reducer"`` (the C++ reducer is
  replaced by per-parameter post-accumulate-grad hooks issuing functional
  all-reduces) and one ``torch.compile``'d forward+loss+backward function with
  ``torch._dynamo.config.compiled_autograd = True`` (the compiled autograd
  tutorial's recipe);
* ``replicate`` - ``torch.distributed._composable.replicate`` (a DDP behind
  module hooks, DDP keywords passed through);
* ``fsdp2`` / ``fsdp2_no_reshard`` - ``torch.distributed.fsdp.fully_shard`` on a
  1-D CPU device mesh over the world, each child module with parameters sharded
  as its own group, then the root; ``reshard_after_forward`` True / False;
* ``zero`` - torch DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer``
  (SGD state sharded over replicas).

Process-global dynamo settings are changed only inside ``config.patch`` blocks
and dynamo's caches are reset at every compiled wrap, so rows sharing one
persistent world process do not leak compiled code or modes into each other.
"""
from __future__ import annotations

from conformance.errors import Unsupported
from conformance.impls.row import Strategy, torch_sync_bn, wrap_torch_ddp
import functools

CPU_ONLY = "the row is measured on the CPU runtime (gloo) only; run it with --runtime cpu"
NOT_ON = {"pjrt": CPU_ONLY, "xrt": CPU_ONLY}


# --- torch.compile(DDP(m)), default optimize_ddp (DDPOptimizer) ---------------

def _fresh_dynamo():
    import torch
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def _user_frame_root(module):
    """Give a bare ``torch.nn`` root (``nn.Sequential``, ``nn.Linear``) a forward
    defined outside torch, in place (state_dict keys unchanged). Dynamo skips
    frames in torch's files; below DDP's skipped forward a torch.nn root's
    frame is skipped too and ``torch.compile(DDP(m))`` compiles no graph at all
    (docs/findings.md, compile_ddp_torch_nn_root)."""
    cls = type(module)
    if cls.__module__.split(".")[0] != "torch":
        return module

    def forward(self, *args, **kwargs):
        return cls.forward(self, *args, **kwargs)
    module.__class__ = type(cls.__name__, (cls,), {"forward": forward, "__module__": __name__})
    return module


def _wrap_torch_compile(module, ctx, kwargs, user_frame_root=True):
    import torch
    _fresh_dynamo()
    ddp = torch.nn.parallel.DistributedDataParallel(
        _user_frame_root(module) if user_frame_root else module, **kwargs)
    return torch.compile(ddp)


def _require_compiled(model, optimizer, ctx):
    """after_backward of the compiled rows: a run that compiled no graph (every
    frame skipped, or the recompile limit hit) is eager DDP, so refuse it
    rather than pass it as compiled. On the compiled-autograd row a backward
    that did not come through the row's compiled step (a kit task calling
    forward/backward itself) is unsupported, as the row's eager tasks are."""
    import torch
    if getattr(model, "_conformance_compiled_autograd", False) and not model.__dict__.pop(
            "_conformance_stepped", False):
        # A kit task (the properties) ran forward/backward itself, not the row's step.
        raise Unsupported(_EAGER_TASKS.format("property"))
    c = torch._dynamo.utils.counters
    if not c["stats"]["unique_graphs"]:
        raise RuntimeError("torch.compile produced no graph: the step ran eagerly")
    if getattr(model, "_conformance_compiled_autograd", False) and not c["compiled_autograd"]["captures"]:
        raise RuntimeError("compiled autograd captured no backward: the backward ran eagerly")


# --- compiled DDP: optimize_ddp="python_reducer" + compiled autograd ----------

COMPILED_DDP_CONFIG = {"optimize_ddp": "python_reducer", "compiled_autograd": True}


def _wrap_compiled_autograd(module, ctx, kwargs):
    import torch
    _fresh_dynamo()

    def step(inputs, loss_fn):
        loss = loss_fn(ddp(inputs))
        loss.backward()
        return loss.detach()
    # Both inside the patch: DDP reads the mode at construction, and a
    # compiled_autograd flag patched only around the call is not honoured
    # (compiled autograd captures nothing).
    with torch._dynamo.config.patch(**COMPILED_DDP_CONFIG):
        ddp = torch.nn.parallel.DistributedDataParallel(module, **kwargs)
        ddp._conformance_step = torch.compile(step)
    ddp._conformance_compiled_autograd = True
    return ddp


def _compiled_forward_backward(model, inputs, loss_fn):
    import torch
    model._conformance_stepped = True  # read (and reset) by _require_compiled
    with torch._dynamo.config.patch(**COMPILED_DDP_CONFIG):
        return model._conformance_step(inputs, loss_fn)


# The kit's task features (state_sync, broadcast_buffers_on, unused_parameters,
# no_sync, join) call the wrapped model and backward() directly: on this row
# that is python_reducer DDP run eagerly, not the compiled step.
_EAGER_TASKS = ("the kit's {} task runs eager forward/backward; on this row that is python_reducer "
                "DDP outside the compiled step, not compiled DDP")


# --- composable replicate() ---------------------------------------------------

REPLICATE_ONCE = ("replicate() applies to a module once (torch.distributed._composable.contract: "
                  "\"Each distinct composable distributed API can only be applied to a module once\"); "
                  "the task wraps the same module a second time")


def _wrap_replicate(module, ctx, kwargs):
    from torch.distributed._composable.contract import _get_registry
    from torch.distributed._composable.replicate import replicate
    if "replicate" in (_get_registry(module) or {}):  # every replica sees the same
        raise Unsupported(REPLICATE_ONCE)
    return replicate(module, **kwargs)


# --- FSDP2 fully_shard on a CPU mesh ------------------------------------------

# DDP keywords/methods fully_shard has no counterpart for (the kit's names).
FSDP2_LACKS = {
    "find_unused_parameters": "fully_shard has no find_unused_parameters (unused parameters "
                              "get no gradient; it reduce-scatters what backward produced)",
    "gradient_as_bucket_view": "fully_shard has no gradient buckets (gradient_as_bucket_view)",
    "bucket_cap_mb": "fully_shard has no gradient buckets (bucket_cap_mb); it groups by module",
    "static_graph": "fully_shard has no static_graph",
    "no_sync": "fully_shard has no no_sync(); its counterpart is set_requires_gradient_sync(False), "
               "which the kit's no_sync task does not call",
    "join": "fully_shard has no join() (uneven inputs are unsupported)",
    "register_comm_hook": "fully_shard has no DDP comm hooks (register_comm_hook)",
    "process_group": "fully_shard takes a device mesh, not a process_group (process groups of replicas are HSDP's "
                     "2-D (replicate, shard) mesh; this row shards over a 1-D world mesh: measured, "
                     "every group started from global rank 0's parameters)",
}
FSDP2_SCALAR = ("fully_shard doesn't support scalar (0-d) parameters (ValueError: change p to a "
                "1-D tensor with numel 1), and this module has one")
FSDP2_NO_BUFFER_BROADCAST = (
    "fully_shard does not broadcast buffers (DDP's broadcast_buffers=True: rank 0's buffers before "
    "every forward), and this module has buffers; with broadcast_buffers=False it runs")


def _world_mesh(ctx):
    """FSDP2's data-parallel mesh: 1-D over the whole world."""
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (ctx.world_size,))


def _fsdp2_wrap(reshard, mesh_of=_world_mesh, after_shard=None):
    """``mesh_of(ctx)`` gives the mesh; ``after_shard(module)`` runs once every
    group is sharded (both only for mutants: conformance/impls/mutants/torchmutants.py)."""
    def wrap(module, ctx, kwargs):
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch import nn
        from torch.distributed.fsdp import fully_shard

        if any(p.dim() == 0 for p in module.parameters()):  # before any collective: all ranks alike
            raise Unsupported(FSDP2_SCALAR)
        broadcast_buffers = kwargs.get("broadcast_buffers", True)
        has_buffers = any(True for _ in module.buffers())
        # fully_shard has no module-state sync (DDP broadcasts rank 0's state at
        # construction); FSDP2's documented way to start from one state is to load
        # rank 0's full state dict with broadcast_from_rank0. Buffers only with
        # broadcast_buffers, as upstream DDP's construction sync.
        full = {k: v.detach().clone() for k, v in module.state_dict().items()
                if broadcast_buffers or k in dict(module.named_parameters())}
        mesh = mesh_of(ctx)
        # One group per child holding parameters (so reshard_after_forward acts on
        # non-root groups), unless a parameter is shared between children (tied).
        # fully_shard refuses a ModuleList/ModuleDict without forward: its parameters
        # stay in the root's group.
        children = [c for c in module.children()
                    if type(c).forward is not nn.Module.forward and any(True for _ in c.parameters())]
        owners = {}
        for child in children:
            for p in child.parameters():
                owners.setdefault(id(p), set()).add(id(child))
        if all(len(o) == 1 for o in owners.values()):
            for child in children:
                fully_shard(child, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
        if after_shard is not None:
            after_shard(module)
        set_model_state_dict(module, full if dist.get_rank() == 0 else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                      strict=bool(broadcast_buffers or not has_buffers)))
        if broadcast_buffers and has_buffers:  # every replica raises the same, after the same collectives
            raise Unsupported(FSDP2_NO_BUFFER_BROADCAST)
        return module
    return wrap


# --- ZeroRedundancyOptimizer --------------------------------------------------

ZERO_GROUP = ("ZeroRedundancyOptimizer shards over its own process group (the world here: the optimizer "
              "is built without the DDP's group), so its post-step broadcast of updated shards crosses "
              "the DDP's process groups (measured: parameters 0.48 off the reference at W=3 and 4)")


def _zero_optimizer(params, run, zero_class=None):
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return (zero_class or ZeroRedundancyOptimizer)(params, optimizer_class=torch.optim.SGD, lr=run.lr,
                                                   momentum=run.momentum)


def _zero_state_dict(opt, ctx):
    """The full (consolidated) optimizer state on every replica: one
    ``consolidate_state_dict(to=r)`` per rank (each is a collective), so every
    replica's state can be compared, not only rank 0's. Each call drops what an
    earlier one consolidated, so a rank reads its copy right after its own."""
    out = None
    for r in range(ctx.world_size):
        opt.consolidate_state_dict(to=r)
        if r == ctx.rank:
            out = opt.state_dict()
    return out


#: What the shipped paths are documented to change (``Strategy.not_transparent``; docs/transparency.md).
COMPILED_KEYS = ("torch.compile returns an OptimizedModule, whose state_dict holds the DDP's keys under "
                 "'_orig_mod.' (the DDP inside keeps 'module.')")
COMPILED_FORWARD = ("the forward is compiled: probes around the module's forward would be traced into "
                    "(or break) the graph under test, so the output and the DDP's part of each forward "
                    "are not observed")
FSDP2_PARAMETERS = ("fully_shard replaces each parameter with a sharded DTensor parameter (and, without "
                    "resharding, swaps the unsharded ones in around forward)")
COMPOSABLE_HOOKS = "{} is a composable API: it registers its forward (and state-dict) hooks on the module itself"


def torch_compile_row(user_frame_root=True) -> Strategy:
    """The ``torch_compile`` row (``user_frame_root=False``: without the re-homed
    root forward, for the catalog's eager-fallback mutant)."""
    return Strategy("torch_compile", "torch.compile(torch.nn.parallel.DistributedDataParallel(m)), default "
                "optimize_ddp (DDPOptimizer splits graphs at bucket boundaries; C++ reducer); a bare "
                "torch.nn root gets a user-code forward so dynamo traces it",
                functools.partial(_wrap_torch_compile, user_frame_root=user_frame_root),
                after_backward=_require_compiled, sync_batchnorm=torch_sync_bn, unsupported=NOT_ON,
                not_transparent={"state_dict": COMPILED_KEYS, "output": COMPILED_FORWARD})


def zero_row(zero_class=None) -> Strategy:
    """The ``zero`` row; ``zero_class`` replaces ``ZeroRedundancyOptimizer`` (mutants)."""
    return Strategy("zero", "torch DDP + torch.distributed.optim.ZeroRedundancyOptimizer(SGD); optimizer "
                "state read after consolidate_state_dict to every rank", wrap_torch_ddp,
                sync_batchnorm=torch_sync_bn, unsupported=NOT_ON,
                make_optimizer=functools.partial(_zero_optimizer, zero_class=zero_class),
                optimizer_state_dict=_zero_state_dict, unsupported_features={"process_group": ZERO_GROUP})


def fsdp2_row(name="fsdp2", reshard=True, **wrap_options) -> Strategy:
    """An FSDP2 row (default: the ``fsdp2`` row); ``wrap_options`` go to :func:`_fsdp2_wrap` (mutants)."""
    return Strategy(name, f"torch.distributed.fsdp.fully_shard(reshard_after_forward={reshard}) per child "
                "module and root on a 1-D CPU mesh; rank 0's state loaded with set_model_state_dict("
                "broadcast_from_rank0); parameters read as DTensor.full_tensor()",
                _fsdp2_wrap(reshard, **wrap_options), sync_batchnorm=torch_sync_bn, unsupported=NOT_ON,
                holds_copies=False, unsupported_features=dict(FSDP2_LACKS),
                not_transparent={"parameters": FSDP2_PARAMETERS,
                                 "module_hooks": COMPOSABLE_HOOKS.format("fully_shard")})


def fsdp2_no_reshard_row() -> Strategy:
    """The ``fsdp2_no_reshard`` row: FSDP2 with ``reshard_after_forward=False``."""
    return fsdp2_row("fsdp2_no_reshard", False)


def compiled_autograd_row() -> Strategy:
    """The ``torch_compiled_autograd`` row (compiled DDP, see the module docstring)."""
    return Strategy("torch_compiled_autograd", "compiled DDP: DDP built with optimize_ddp='python_reducer', "
                    "one torch.compile'd forward+loss+backward with compiled_autograd=True",
                    _wrap_compiled_autograd, after_backward=_require_compiled, sync_batchnorm=torch_sync_bn,
                    unsupported=NOT_ON, forward_backward=_compiled_forward_backward,
                    not_transparent={"output": COMPILED_FORWARD},
                    unsupported_features={k: _EAGER_TASKS.format(k) for k in
                                          ("find_unused_parameters", "no_sync", "join")})


def replicate_row() -> Strategy:
    """The ``replicate`` row: the composable ``replicate()``."""
    return Strategy("replicate", "torch.distributed._composable.replicate(m, **ddp_kwargs)", _wrap_replicate,
                    sync_batchnorm=torch_sync_bn, unsupported=NOT_ON,
                    not_transparent={"module_hooks": COMPOSABLE_HOOKS.format("replicate")})


def shipped_rows() -> list[Strategy]:
    """The rows of this module (see the module docstring), in :data:`conformance.impls.builtin.ROWS` order."""
    return [torch_compile_row(), compiled_autograd_row(), replicate_row(), zero_row(), fsdp2_row(),
            fsdp2_no_reshard_row()]
