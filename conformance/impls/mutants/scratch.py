"""Mutants of the scenario kinds, on a compact from-scratch DDP (not the reference).

:class:`ScratchDDP` is a small correct DDP written directly on torch.distributed:
module-state broadcast at construction; buffers broadcast before a forward when the
previous forward was synced (torch's ``require_forward_param_sync``); ``no_sync()``;
at the end of every synced backward one all-reduce of all gradients, flattened in
parameter order, divided by the world size; ``find_unused_parameters`` with a
used mask in which a parameter holding an accumulated gradient counts as used.
Keywords it does not implement raise ``TypeError`` (the kit's constructor
contract). Each subclass below breaks it in one way a field report did; sharing no
code with ``ddp_impl`` keeps the reference's own faults from hiding theirs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import weakref

import torch
import torch.distributed as dist
from torch import nn


class ScratchDDP(nn.Module):
    """Correct base (see the module docstring). CPU runtime (gloo) only."""

    def __init__(self, module: nn.Module, broadcast_buffers: bool = True, find_unused_parameters: bool = False):
        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self._sync_grads = True
        self._sync_next_forward = True
        self._queued = False
        self._fired: list = []
        self.synced_steps = 0
        with torch.no_grad():
            for t in list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []):
                dist.broadcast(t.data, 0)
        # Weakly: torch's gc cannot see a parameter's post-accumulate-grad hooks, so a
        # bound method there would keep every wrapper alive for the host's life.
        on_grad = weakref.WeakMethod(self._on_grad)

        def hook(p):
            m = on_grad()
            if m is not None:
                m(p)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(hook)

    # -- buffers ---------------------------------------------------------------
    def _current_buffers(self):
        return list(self.module.buffers())

    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and torch.is_grad_enabled() and self._sync_next_forward:
            with torch.no_grad():
                for b in self._current_buffers():
                    dist.broadcast(b, 0)
        self._sync_next_forward = torch.is_grad_enabled() and self._sync_grads
        self._last_batch = args[0].shape[0] if args and torch.is_tensor(args[0]) else 1
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        old, self._sync_grads = self._sync_grads, False
        try:
            yield
        finally:
            self._sync_grads = old

    # -- gradients -------------------------------------------------------------
    def _on_grad(self, p):
        if not self._sync_grads:
            return
        self._fired.append(p)
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _order(self, params):
        """The order gradients are packed in (parameter order: the same on every replica)."""
        return params

    @torch.no_grad()
    def _finish(self):
        self._queued = False
        self.synced_steps += 1
        params = [p for p in self.module.parameters() if p.requires_grad]
        used = torch.tensor([float(p.grad is not None) for p in params])  # produced or accumulated here
        if self.find_unused_parameters:
            dist.all_reduce(used)
        elif not bool(used.all()):
            names = [n for (n, p), u in zip(self.module.named_parameters(), used) if p.requires_grad and not u]
            raise RuntimeError(f"parameters without gradient and find_unused_parameters=False: {names}")
        live = [p for p, u in zip(params, used.tolist()) if u > 0]
        order = self._order(live)
        self._fired = []
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in order])
        flat = self._reduce(flat)
        off = 0
        for p in order:
            g = flat[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
            if p.grad is None:
                p.grad = g
            else:
                p.grad.copy_(g)

    def _reduce(self, flat):
        dist.all_reduce(flat)
        return flat / self.world_size


class UnusedAccumDropped(ScratchDDP):
    """find_unused_parameters: "used" means a hook fired in the synced backward, so a
    parameter used only in the no_sync micro-steps of the window counts as unused and
    its accumulated gradient is never averaged (replicas drift apart)."""

    @torch.no_grad()
    def _finish(self):
        fired = {id(p) for p in self._fired}
        params = [p for p in self.module.parameters() if p.requires_grad]
        keep = {id(p): p.grad for p in params if id(p) not in fired}
        for p in params:  # hide accumulated-only gradients from the reduction, restore them after
            if id(p) in keep:
                p.grad = None
        super()._finish()
        for p in params:
            if id(p) in keep and p.grad is None:
                p.grad = keep[id(p)]


class ArrivalOrderPairing(ScratchDDP):
    """Packs gradients into the flat buffer in the order their hooks fired: with
    rank-dependent control flow the replicas' slots hold different parameters, so
    equal-sized parameters are averaged with each other (silently)."""

    def _order(self, params):
        live = {id(p) for p in params}
        fired = [p for p in self._fired if id(p) in live]
        done = {id(p) for p in fired}
        return fired + [p for p in params if id(p) not in done]


class CachedBufferList(ScratchDDP):
    """Caches the module's buffer list at construction and broadcasts those objects:
    a model that assigns new buffer tensors in forward gets the stale ones broadcast."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        self._cached = list(module.buffers())

    def _current_buffers(self):
        return self._cached


class ReplicaDrift(ScratchDDP):
    """From the second synced step, replica r scales its synced gradient by
    (1 + 1e-6 r): parity stays within atol, replicas stop being identical."""

    def _reduce(self, flat):
        out = super()._reduce(flat)
        return out * (1 + 1e-6 * self.rank) if self.synced_steps >= 2 else out


class LateDesync(ScratchDDP):
    """Stops synchronising gradients from the 41st synced step on."""

    def _reduce(self, flat):
        return flat if self.synced_steps > 40 else super()._reduce(flat)


class BatchWeighted(ScratchDDP):
    """Weights each replica's gradient by its local batch size (sum of n_r g_r / sum n_r)
    instead of DDP's equal average of the replicas' local-mean gradients: identical
    with equal shards, wrong with uneven ones."""

    def _reduce(self, flat):
        n = torch.tensor([float(self._last_batch)])
        dist.all_reduce(n)
        flat = flat * float(self._last_batch)
        dist.all_reduce(flat)
        return flat / n


class Fp16AllReduce(ScratchDDP):
    """All-reduces gradients in float16 (a compression hook without scaling): large
    loss scales overflow to inf, small gradients lose precision."""

    def _reduce(self, flat):
        half = flat.half()
        dist.all_reduce(half)
        return half.float() / self.world_size


# -- transparency: what the module, the optimizer, the RNG and the user's code observe ----------
class ParamSwap(ScratchDDP):
    """Replaces every parameter with a new ``nn.Parameter`` holding the same values at wrap
    time: an optimizer a user built on ``module.parameters()`` before wrapping updates tensors
    that no longer train (numbers stay right for an optimizer built after wrapping)."""

    def __init__(self, module, **kw):
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is not None:
                    setattr(m, name, nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
        super().__init__(module, **kw)


class RngSync(ScratchDDP):
    """Sets every replica's default generator to rank 0's state at wrap time: dropout masks
    a user seeded per rank are then the same on every replica."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        state = torch.get_rng_state()
        dist.broadcast(state, 0)
        torch.set_rng_state(state)


class RngConsume(ScratchDDP):
    """Draws a random bucket order from the default generator in every forward (a bucket
    priority shuffle): the user's random stream shifts by one draw per forward."""

    def forward(self, *args, **kwargs):
        torch.randperm(4)
        return super().forward(*args, **kwargs)


class TrainModeAtWrap(ScratchDDP):
    """Calls ``module.train()`` at wrap time: a submodule the user froze in eval mode (a
    teacher, an embedding) trains in train mode."""

    def __init__(self, module, **kw):
        module.train()
        super().__init__(module, **kw)


class UnfreezeAtWrap(ScratchDDP):
    """Sets ``requires_grad=True`` on every parameter at wrap time: frozen parameters train."""

    def __init__(self, module, **kw):
        for p in module.parameters():
            p.requires_grad_(True)
        super().__init__(module, **kw)


class StateDictUnprefixed(ScratchDDP):
    """``state_dict()`` returns the module's keys without the ``module.`` prefix torch's DDP
    gives (a checkpoint saved from it does not load into torch's DDP, nor the reverse)."""

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)


class OutputFlattened(ScratchDDP):
    """Keeps only the tensors of the dicts in a structured output (as a DDP that walks the
    output to find used tensors and rebuilds it from them): the module's non-tensor members
    (a string, a flag) are silently dropped."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if dataclasses.is_dataclass(out):
            return dataclasses.replace(out, **{f.name: {k: v for k, v in getattr(out, f.name).items()
                                                        if torch.is_tensor(v)}
                                               for f in dataclasses.fields(out)
                                               if isinstance(getattr(out, f.name), dict)})
        if isinstance(out, dict):
            return {k: v for k, v in out.items() if torch.is_tensor(v)}
        return out


class UserHookBypassed(ScratchDDP):
    """Captures each gradient with its own ``Tensor.register_hook`` at wrap time (so it runs
    before any hook the user registers later) and reduces the captured raw gradients: a hook the
    user put on a parameter after wrapping (scaling, clipping) is lost from the reduced gradient."""

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        self._raw = {}
        for p in module.parameters():
            if p.requires_grad:
                p.register_hook(self._capture(p))

    def _capture(self, p):
        ref = weakref.ref(p)

        def hook(g):
            q = ref()
            if q is not None and self._sync_grads:
                self._raw[id(q)] = g.detach().clone() if id(q) not in self._raw else self._raw[id(q)] + g.detach()
            return g
        return hook

    @torch.no_grad()
    def _finish(self):
        params = [p for p in self.module.parameters() if p.requires_grad]
        for p in params:  # the raw sums of this backward stand in for what accumulated into .grad
            if id(p) in self._raw and p.grad is not None:
                p.grad.copy_(self._raw[id(p)])
        self._raw = {}
        super()._finish()


class ParamsRelaid(ScratchDDP):
    """Makes every non-contiguous parameter contiguous in place at wrap time (``p.data =
    p.data.contiguous()``): the same objects and values, but a channels_last or transposed layout
    the user chose is gone, and with it the gradients' layout."""

    def __init__(self, module, **kw):
        for p in module.parameters():
            if not p.is_contiguous():
                p.data = p.data.contiguous()
        super().__init__(module, **kw)


class DefaultDtypeLeak(ScratchDDP):
    """Sets the process's default dtype to the widest floating dtype of the module's parameters at
    wrap time and never restores it: the user's later ``torch.tensor(...)`` / ``torch.zeros(...)``
    come out float64 after wrapping a float64 model."""

    def __init__(self, module, **kw):
        widest = max((p.dtype for p in module.parameters() if p.is_floating_point()),
                     key=lambda d: torch.finfo(d).bits, default=torch.float32)
        torch.set_default_dtype(widest)
        super().__init__(module, **kw)


class AllReduceWrapped(ScratchDDP):
    """Replaces ``torch.distributed.all_reduce`` with a counting wrapper at wrap time (collective
    profiling) and never puts it back: every later user of the process calls the wrapper."""

    def __init__(self, module, **kw):
        original = dist.all_reduce

        def counted(*args, **kwargs):
            return original(*args, **kwargs)
        dist.all_reduce = counted
        super().__init__(module, **kw)


class LauncherEnvSet(ScratchDDP):
    """Writes a launcher's rendezvous variables (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
    ``WORLD_SIZE``) into the process's environment at wrap time and leaves them there."""

    def __init__(self, module, **kw):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1")
        super().__init__(module, **kw)


class GlobalHookLeft(ScratchDDP):
    """Counts forwards with a global module forward hook (``register_module_forward_hook``) it
    never removes: every module of the process runs it, under every later DDP."""

    def __init__(self, module, **kw):
        self.forwards = 0
        self._global = torch.nn.modules.module.register_module_forward_hook(self._count)
        super().__init__(module, **kw)

    def _count(self, module, args, output):
        self.forwards += 1
