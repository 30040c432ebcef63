"""Run setups: what a case adds to the shared training loop, as data.

A case row names setups (``Case.train["setups"]``); the loop
(:func:`conformance.cases.shared.loop.train_replica`) calls every setup's hooks and knows
none of them. A setup also tells the single-device reference what it changes
(``reference``: keyword overrides of :func:`conformance.cases.shared.reference.reference_run`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from conformance.errors import Unsupported
from conformance.worlds.registry import adapter_named


def register_hook(ddp, impl_name: str, hook, state=None) -> None:
    """``ddp.register_comm_hook(state, hook)`` (every kind that registers a comm hook); a DDP that
    raises ``NotImplementedError`` there (it cannot run a hook in this configuration, e.g. the
    reference DDP on the XLA collectives) is ``unsupported`` with its message.

    Raises:
        Unsupported: the DDP raised ``NotImplementedError``.
    """
    try:
        ddp.register_comm_hook(state, hook)
    except NotImplementedError as exc:
        raise Unsupported(f"{impl_name} cannot register a comm hook here: {exc}") from None


@dataclass(frozen=True)
class Setup:
    """Base setup: every hook does nothing.

    Attributes:
        name: table key.
        requires: DDP keywords / methods it needs the implementation to honour.
        reference: overrides for the reference run (e.g. ``{"sync_bn": True}``).
    """

    name: str
    requires: tuple = ()
    reference: dict = field(default_factory=dict)

    def prepare_model(self, model, loop):
        """Convert the freshly built module (before wrapping); return it."""
        return model

    def after_wrap(self, loop) -> None:
        """Called once the DDP and its optimizer are built (``loop.ddp``, ``loop.opt``)."""

    def construction_context(self, loop):
        """Context manager around the DDP's construction."""
        return contextlib.nullcontext()

    def forward_context(self, loop, step: int):
        """Context manager around the forward of step ``step`` (0-based)."""
        return contextlib.nullcontext()

    def after_step(self, loop, step: int) -> None:
        """Called after ``optimizer.step()`` of step ``step`` and the trajectory read."""

    def groups(self, world_size: int) -> list | None:
        """The replicas' data-parallel jobs as lists of global ranks (each trains its own
        global batch and is judged against its own reference), or ``None``: one job of
        every replica."""
        return None

    def ddp_kwargs(self, loop) -> dict:
        """DDP keywords built on the replica at wrap time (e.g. a process group)."""
        return {}


class SyncBatchNormSetup(Setup):
    """BatchNorm layers converted to the implementation's SyncBatchNorm (global-batch
    statistics; the reference runs BatchNorm on the global batch)."""

    def prepare_model(self, model, loop):
        if loop.impl.sync_batchnorm is None:
            raise Unsupported(f"{loop.impl.name} has no SyncBatchNorm")
        return loop.impl.sync_batchnorm(model, loop.ctx)

    @contextlib.contextmanager
    def construction_context(self, loop):
        try:
            yield
        except ValueError as exc:  # torch's SyncBatchNorm refuses CPU modules
            if "SyncBatchNorm" in str(exc):
                raise Unsupported(f"{type(exc).__name__}: {exc}") from None
            raise

    def forward_context(self, loop, step):
        return self.construction_context(loop)


@dataclass(frozen=True)
class CommHookSetup(Setup):
    """A registered communication hook: ``hook`` of torch's ``ddp_comm_hooks.default_hooks``
    (``fp16_compress_hook``: the bucket cast to float16, divided by the world size, all-reduced and
    copied back into the bucket buffer; float16 rounding: its own tolerance)."""

    hook: str = "allreduce_hook"

    def after_wrap(self, loop):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        register_hook(loop.ddp, loop.impl.name, getattr(default_hooks, self.hook))


class _Bf16CommHook(CommHookSetup):
    """torch's ``bf16_compress_hook``: as fp16's in bfloat16 (8-bit mantissa). A DDP that
    refuses it with ``TypeError`` is ``unsupported`` (torch 2.13's DDP on CPU raises
    "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL" in
    ``register_comm_hook``, although gloo all-reduces bfloat16)."""

    def after_wrap(self, loop):
        try:
            super().after_wrap(loop)
        except TypeError as exc:
            raise Unsupported(f"{loop.impl.name} refuses bf16_compress_hook: {exc}") from None

    @contextlib.contextmanager
    def forward_context(self, loop, step):
        try:  # a lazily built DDP (replicate) registers the hook, and refuses it, at its first forward
            yield
        except TypeError as exc:
            if "BF16" not in str(exc):
                raise
            raise Unsupported(f"{loop.impl.name} refuses bf16_compress_hook: {exc}") from None


def out_of_place_mean_hook(process_group, bucket):
    """A comm hook whose future's value is a NEW tensor: the replicas' mean of
    ``bucket.buffer()`` (1-D, the bucket's dtype), computed out of place; the bucket
    buffer is left untouched (still this replica's local gradients).

    The hook contract (``DistributedDataParallel.register_comm_hook``, torch's DDP comm-hook
    docs): the future's value *is* the reduced bucket; upstream's reducer copies it into the
    gradients (``reducer.cpp``, ``populate_bucket_views_out``). torch's own hooks happen to
    write the buffer in place, so only a hook like this one shows a DDP that reads the
    buffer back instead. ``process_group``: the group (``None``: the default group).
    """
    import torch.distributed as dist
    group = process_group if process_group is not None else dist.group.WORLD
    mean = bucket.buffer() / dist.get_world_size(group)  # a new tensor; the buffer stays as is
    return dist.all_reduce(mean, group=group, async_op=True).get_future().then(lambda f: f.value()[0])


class OutOfPlaceCommHookSetup(Setup):
    """The kit's :func:`out_of_place_mean_hook` registered (exact: float32 tolerance)."""

    def after_wrap(self, loop):
        register_hook(loop.ddp, loop.impl.name, out_of_place_mean_hook)


class NonReentrantCheckpointSetup(Setup):
    """The model runs blocks under non-reentrant activation checkpointing: ``unsupported`` on an
    XLA device (torch 2.9's checkpoint raises AttributeError "module 'torch' has no attribute 'xla'",
    torch_xla 2.9's ValueError "XLA currently does not support use_reentrant==False")."""

    def prepare_model(self, model, loop):
        if loop.ctx.device.type == "xla":
            raise Unsupported("non-reentrant activation checkpointing on XLA: torch.utils.checkpoint "
                              "raises AttributeError (no torch.xla device module, torch 2.9) and "
                              "torch_xla.utils.checkpoint supports use_reentrant=True only")
        return model


class AutocastSetup(Setup):
    """Forward under ``torch.autocast`` with the dtype in ``reference["autocast"]``."""

    def forward_context(self, loop, step):
        import torch
        return torch.autocast(device_type=loop.ctx.device.type,
                              dtype=getattr(torch, self.reference["autocast"]))


@dataclass(frozen=True)
class CheckpointSetup(Setup):
    """After step ``steps // 2`` the state (``reference``-free: the trajectory must
    be the uninterrupted one) is saved with ``torch.save`` - the DDP wrapper's
    state_dict (``module.`` prefix; ``source`` ``"module"``: the inner module's) with the
    optimizer's, the model is rebuilt from other seeds, reloaded and wrapped again."""

    source: str = "ddp"

    def after_step(self, loop, step):
        from conformance.cases.shared.readback import optimizer_state_dict, saved_checkpoint
        if step != loop.run.steps // 2:
            return
        state = loop.ddp.state_dict() if self.source == "ddp" else loop.model.state_dict()
        model_state, optim_state = saved_checkpoint(state, optimizer_state_dict(loop.impl, loop.opt, loop.ctx))
        loop.model = loop.fresh_model(salt=1)
        loop.model.load_state_dict(model_state)
        loop.wrap()
        loop.opt.load_state_dict(optim_state)


class ResumeInPlaceSetup(Setup):
    """After step ``steps // 2`` the DDP wrapper's and the optimizer's state_dicts are saved, the
    live parameters overwritten (a run rolled back) and the saved state loaded back into the *same*
    DDP and optimizer objects, which keep training: the trajectory must be the uninterrupted one."""

    def after_step(self, loop, step):
        import torch

        from conformance.cases.shared.readback import optimizer_state_dict, saved_copy
        if step != loop.run.steps // 2:
            return
        saved = saved_copy({"model": loop.ddp.state_dict(),
                            "optim": optimizer_state_dict(loop.impl, loop.opt, loop.ctx)})
        with torch.no_grad():
            for p in loop.model.parameters():
                p.add_(1.0)
        loop.ctx.mark_step()
        loop.ddp.load_state_dict(saved["model"])
        loop.opt.load_state_dict(saved["optim"])
        loop.ctx.mark_step()


#: The process_groups setup's groups: HSDP-style process groups of two ({0,1}, {2,3}); at W=3 a
#: group of two and a singleton (a divisor or broadcast taken from the world still shows there).
SUBGROUP_SIZE = 2
SUBGROUPS_MIN_WORLD_SIZE = 3


class ProcessGroupsSetup(Setup):
    """``DDP(module, process_group=<my group>)`` with the world split into groups of
    :data:`SUBGROUP_SIZE` consecutive ranks (the runtime adapter's ``make_process_group``: every
    rank calls ``torch.distributed.new_group`` in the same order, as upstream requires). Each
    group is its own data-parallel job on its own global batch (seeded by its first rank); upstream
    DDP averages over the group (divisor = group size) and broadcasts module states from the
    group's rank 0, its lowest global rank (``DistributedDataParallel``'s docs, ``process_group``;
    pytorch/pytorch#36516 on the divisor). Models without buffers only: the reference starts each
    group from its first rank's parameters.

    Raises:
        Unsupported: below :data:`SUBGROUPS_MIN_WORLD_SIZE`, or where the replicas are not
            the ranks of one torch.distributed world (PJRT: threads of one process).
    """

    def groups(self, world_size):
        return [list(range(r, min(r + SUBGROUP_SIZE, world_size))) for r in range(0, world_size, SUBGROUP_SIZE)]

    def ddp_kwargs(self, loop):
        if getattr(loop, "process_group", None) is None:
            ctx = loop.ctx
            if ctx.world_size < SUBGROUPS_MIN_WORLD_SIZE:
                raise Unsupported(f"process subgroups need world size >= {SUBGROUPS_MIN_WORLD_SIZE} "
                                  f"(W={ctx.world_size} holds one group of {SUBGROUP_SIZE}: no subgroups)")
            adapter = adapter_named(ctx.runtime)  # the runtime adapter's make_process_group
            make = adapter.make_process_group if adapter is not None else None
            if make is None:
                raise Unsupported(f"process subgroups: no process groups on the {ctx.runtime} runtime")
            loop.process_group = make(ctx, self.groups(ctx.world_size))
        return {"process_group": loop.process_group}


SETUPS = {s.name: s for s in [
    SyncBatchNormSetup("sync_bn", reference={"sync_bn": True}),
    CommHookSetup("comm_hook_allreduce", requires=("register_comm_hook",)),
    AutocastSetup("autocast_bf16", reference={"autocast": "bfloat16"}),
    CheckpointSetup("checkpoint_ddp"),
    CheckpointSetup("checkpoint_module", source="module"),
    ResumeInPlaceSetup("checkpoint_resume"),
    ProcessGroupsSetup("process_groups", requires=("process_group",)),
    # Comm hooks that return a new tensor or compress.
    CommHookSetup("comm_hook_fp16", requires=("register_comm_hook",), hook="fp16_compress_hook"),
    _Bf16CommHook("comm_hook_bf16", requires=("register_comm_hook",), hook="bf16_compress_hook"),
    OutOfPlaceCommHookSetup("comm_hook_out_of_place", requires=("register_comm_hook",)),
    NonReentrantCheckpointSetup("checkpoint_nonreentrant"),
]}


def replica_groups(setups, world_size: int) -> list:
    """The data-parallel jobs of a run with ``setups`` (names or rows) at ``world_size``:
    lists of global ranks (one list of every rank unless a setup splits the world)."""
    for s in setups:
        got = (SETUPS[s] if isinstance(s, str) else s).groups(world_size)
        if got is not None:
            return got
    return [list(range(world_size))]
