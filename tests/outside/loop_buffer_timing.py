"""Buffer-sync timing in users' loops: a correct DDP and three faults, written from outside.

Written by a helper given only the README and the fault kind ("when buffers are broadcast relative
to forwards, backwards, grad mode and no_sync in real training loops"), from scratch on
torch.distributed (no code shared with the kit or torch's DDP). Kept unchanged as regression input:

* ``CorrectDDP``: torch's rule (broadcast before a forward when the previous forward of *this*
  wrapper ran with grad enabled outside ``no_sync()``); passes the main command.
* ``SharedStateDDP`` (25.10): the flag lives in a class attribute shared by every instance, so a
  second DDP in the loop (a frozen teacher run under ``no_grad``) clears the trained one's
  broadcast. Caught since ``scenario.loop`` draws ``loop.teacher``.
* ``FrozenNoArmDDP`` (25.11): a forward arms the next broadcast only if some parameter still
  requires grad: a model frozen after wrapping (a GAN's D during the G step) does not. Not caught:
  freezing after wrapping is not drawn (docs/scenarios.md, row 19).
* ``ConsumeFlagDDP`` (25.12): the flag is cleared before the module runs and set after it returns,
  so a forward that raises (a loop that skips a bad batch) leaves it cleared. Caught since
  ``scenario.loop`` draws a forward that raises after the buffers moved (eval grad ``raising``).
* ``NoSyncRearmDDP``: a grad-enabled forward under ``no_sync()`` re-arms the flag (caught; the
  helper's check that its wrapper's faults can show at all).
"""
import contextlib
import dataclasses

import torch
import torch.distributed as dist
from torch import nn


def _tensors(obj, seen=None):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))


def _bcast_(t, src=0, group=None):
    tmp = t.detach().clone(memory_format=torch.contiguous_format)
    dist.broadcast(tmp, src, group=group)
    with torch.no_grad():
        t.copy_(tmp)


class CorrectDDP(nn.Module):
    """Buffers: before a forward, broadcast from rank 0 iff broadcast_buffers and the previous
    forward ran with grad enabled outside no_sync() (torch's require_forward_param_sync)."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=True, process_group=None,
                 find_unused_parameters=False, **kwargs):
        super().__init__()
        if kwargs:
            raise TypeError(f"unsupported DDP keywords: {sorted(kwargs)}")
        if device_ids is not None or output_device is not None or dim != 0 or process_group is not None:
            raise TypeError("device_ids/output_device/dim/process_group not supported")
        if not dist.is_initialized():
            raise RuntimeError("default process group not initialised")
        self.module = module
        self.broadcast_buffers = bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.world_size = dist.get_world_size()
        self.require_backward_grad_sync = True
        self._init_forward_flag()
        self._sync_pending = False
        self._callback_queued = False
        ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self._ignore = ignore
        self._params = [p for n, p in module.named_parameters() if n not in ignore and p.requires_grad]
        self._used = [False] * len(self._params)
        with torch.no_grad():
            for n, p in module.named_parameters():
                if n not in ignore:
                    _bcast_(p)
            if self.broadcast_buffers:
                for b in self._buffers_to_sync():
                    _bcast_(b)
        for i, p in enumerate(self._params):
            p.register_post_accumulate_grad_hook(self._make_hook(i))

    # --- forward flag (overridden by F1) -----------------------------------
    def _init_forward_flag(self):
        self._forward_synced = True

    def _get_flag(self):
        return self._forward_synced

    def _set_flag(self, v):
        self._forward_synced = v

    # --- buffers -------------------------------------------------------------
    def _buffers_to_sync(self):
        return [b for n, b in self.module.named_buffers() if n not in self._ignore]

    def _sync_buffers(self):
        bufs = self._buffers_to_sync()
        if not bufs:
            return
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(tuple(bufs)):
            for b in bufs:
                _bcast_(b, 0)

    def _is_synced_forward(self):
        return torch.is_grad_enabled() and self.require_backward_grad_sync

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self._get_flag():
            self._sync_buffers()
        out = self.module(*inputs, **kwargs)
        synced = self._is_synced_forward()
        self._set_flag(synced)
        self._after_forward(out, synced)
        return out

    # --- gradients -----------------------------------------------------------
    def _after_forward(self, out, synced):
        if torch.is_grad_enabled():  # a no_grad forward leaves a pending backward's sync alone (as torch)
            self._sync_pending = synced
        if synced:
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(self._out_hook)

    def _out_hook(self, grad):
        self._queue()
        return grad

    def _queue(self):
        if self._sync_pending and not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _make_hook(self, i):
        def hook(p):
            self._used[i] = True
            self._queue()
        return hook

    def _finalize(self):
        self._callback_queued = False
        self._sync_pending = False
        used = torch.tensor([1.0 if u else 0.0 for u in self._used], dtype=torch.float64)
        dist.all_reduce(used)
        self._used = [False] * len(self._params)
        with torch.no_grad():
            for p, u in zip(self._params, used.tolist()):
                if u == 0:
                    continue
                g = p.grad
                if g is None:
                    p.grad = g = torch.zeros_like(p)
                if g.is_sparse:
                    red = (g.coalesce() / self.world_size)
                    dist.all_reduce(red)
                    p.grad = red.coalesce()
                    continue
                tmp = g.detach().clone(memory_format=torch.contiguous_format)
                tmp.div_(self.world_size)
                dist.all_reduce(tmp)
                g.copy_(tmp)

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old


class SharedStateDDP(CorrectDDP):
    """F1: the 'previous forward was synced' flag lives in a mutable class attribute (a dict),
    so every DDP instance in the process shares it: another model's forward re-arms/clears it."""
    _state = {"forward_synced": True}

    def _init_forward_flag(self):
        self._state["forward_synced"] = True

    def _get_flag(self):
        return self._state["forward_synced"]

    def _set_flag(self, v):
        self._state["forward_synced"] = v


class FrozenNoArmDDP(CorrectDDP):
    """F2: a forward counts as a training (synced) forward only if some parameter still requires
    grad: a forward of a model frozen after wrapping (GAN D during the G step, DINO teacher) with
    grad enabled does not arm the next forward's buffer broadcast."""

    def _is_synced_forward(self):
        return (torch.is_grad_enabled() and self.require_backward_grad_sync
                and any(p.requires_grad for p in self.module.parameters()))


class ConsumeFlagDDP(CorrectDDP):
    """F3: the flag is consumed (cleared) at the start of the forward, and set again only when the
    forward returns: a forward that raises (skip-bad-batch / OOM recovery) leaves it cleared, so the
    next forward skips the broadcast torch does."""

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self._get_flag():
            self._sync_buffers()
        self._set_flag(False)
        out = self.module(*inputs, **kwargs)
        synced = self._is_synced_forward()
        self._set_flag(synced)
        self._after_forward(out, synced)
        return out


class NoSyncRearmDDP(CorrectDDP):
    """Sanity mutant (expected CAUGHT): a grad-enabled forward inside no_sync() re-arms the flag."""

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self._get_flag():
            self._sync_buffers()
        out = self.module(*inputs, **kwargs)
        self._set_flag(torch.is_grad_enabled())
        self._after_forward(out, self._is_synced_forward())
        return out
