"""The single-device reference (oracle): the same steps on one CPU device.

For models whose forward does not couple samples, the reference trains on the whole global
batch: with equal shards and a mean-reduced loss its gradient is exactly what DDP promises. For
batch-coupled models (BatchNorm) a DDP replica normalises with its *own* shard's statistics, so
the reference runs the W shards one after another on one device and averages their losses - the
documented semantics of DDP without SyncBatchNorm (with it: one global forward, global-batch
statistics). A model that draws random numbers (dropout) also runs shard by shard, each shard on
its replica's generator stream (seeded per rank before wrapping), so the reference replays each
replica's masks. Buffers follow upstream DDP: with ``broadcast_buffers`` every replica starts a
forward from rank 0's buffers, else from its own; the reference tracks every rank's.
"""
from __future__ import annotations

import functools

import numpy as np

from conformance.cases.shared.loop import RunSpec, build_optimizer, rank_buffer_offset
from conformance.cases.shared.readback import flat_buffers, flat_optimizer_state, flat_params
import contextlib
from conformance.cases.shared.setups import SETUPS
from conformance.cases.shared.transparency import RNG_SEED, RNG_SEED_STRIDE
from fixtures import build_model, global_batch, shard
from fixtures.models import MODELS, StreamDropout, training_loss

# Runtime quirks the reference can reproduce (a runtime adapter lists its own in
# ``Runtime.reference_quirks``): differences of the runtime's *ops*
# from CPU PyTorch, which are not the DDP's to fix.
QUIRKS = {
    # torch_xla 2.9 (PJRT): BatchNorm in training mode updates running_var with
    # the biased batch variance (sum / n) where CPU PyTorch uses the unbiased one
    # (sum / (n - 1)); the normalisation itself (biased) and running_mean agree.
    "bn_running_var_biased": "BatchNorm running_var is updated with the biased batch variance",
    # The same op when SyncBatchNorm runs as XLA's BatchNorm over the global
    # batch (SPMD: torch.nn.SyncBatchNorm without a process group falls back to it).
    "sync_bn_running_var_biased": "SyncBatchNorm's running_var is updated with the biased batch "
                                  "variance (it runs as XLA's BatchNorm)",
}


def _biased_running_var(net):
    """Make every BatchNorm of ``net`` update running_var as torch_xla does."""
    import torch

    def pre(mod, args):
        if mod.training and mod.track_running_stats:
            x = args[0]
            dims = [0] + list(range(2, x.dim()))
            mod._quirk = (mod.running_var.detach().clone(),
                          x.detach().float().var(dim=dims, unbiased=False))

    def post(mod, args, out):
        saved = mod.__dict__.pop("_quirk", None)
        if saved is None:
            return
        old, biased = saved
        m = mod.momentum if mod.momentum is not None else 1.0 / float(mod.num_batches_tracked)
        # A fresh tensor, not copy_(): BatchNorm's backward saved the old one.
        mod._buffers["running_var"] = ((1 - m) * old + m * biased).to(old.dtype)

    for mod in net.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            mod.register_forward_pre_hook(pre)
            mod.register_forward_hook(post)


@contextlib.contextmanager
def _stream(net, streams, r: int):
    """Run the block with every ``StreamDropout`` of ``net`` drawing from replica ``r``'s generator
    (``streams[r]``, advanced by the draws); no-op for ``streams`` ``None``."""
    if streams is None:
        yield
        return
    layers = [m for m in net.modules() if isinstance(m, StreamDropout)]
    for m in layers:
        m.generator = streams[r]
    try:
        yield
    finally:
        for m in layers:
            m.generator = None


def _per_shard(model: str, sync_bn: bool) -> bool:
    """Whether the reference runs the W shards one after another (module docstring)."""
    return (MODELS[model].batch_coupled and not sync_bn) or MODELS[model].draws_random


class _ReferenceNet:
    """The reference's module (the run's model from ``seed``, with the runtime's quirks), its
    buffer slots, its forward under the run's autocast, and each replica's generator stream
    (a model that draws random numbers)."""

    def __init__(self, model: str, seed: int, world_size: int, autocast: str, sync_bn: bool, quirks):
        import torch
        self.model, self.world_size, self.autocast = model, world_size, autocast
        # each replica's generator as the train loop seeds it before wrapping (transparency.RNG_SEED);
        # the process's own generator is not touched
        self.streams = [torch.Generator().manual_seed(RNG_SEED + RNG_SEED_STRIDE * r)
                        for r in range(world_size)] if MODELS[model].draws_random else None
        self.net = build_model(model, seed=seed)
        # SyncBatchNorm is the DDP's own code, except where the runtime's BatchNorm runs it
        if ("bn_running_var_biased" in quirks and not sync_bn) or ("sync_bn_running_var_biased" in quirks and sync_bn):
            _biased_running_var(self.net)
        self.slots = [(m, n) for m in self.net.modules() for n, b in m._buffers.items() if b is not None]

    def forward(self, inp):
        import torch
        ctx = (torch.autocast(device_type="cpu", dtype=getattr(torch, self.autocast)) if self.autocast
               else contextlib.nullcontext())
        with ctx:
            return self.net(inp, **MODELS[self.model].forward_kwargs)

    def bufs(self) -> list:
        return [m._buffers[n] for m, n in self.slots]

    def set_bufs(self, values) -> None:
        # Fresh tensors, not copy_(): BatchNorm's backward saved the old ones.
        for (m, n), v in zip(self.slots, values):
            m._buffers[n] = v.clone()

    def flat_buffers(self, rank_bufs) -> np.ndarray:
        """``[W, B]``: every rank's buffers ``rank_bufs``, flat (the module keeps the last rank's)."""
        flat = []
        for r in range(self.world_size):
            self.set_bufs(rank_bufs[r])
            flat.append(flat_buffers(self.net))
        return np.stack(flat)

    def loss(self, x, y, rank_bufs, broadcast_buffers: bool, coupled: bool) -> tuple:
        """``(loss, buffers after)`` of one step's forward on global batch ``x, y``: one forward,
        or (``coupled``) the W shards one after another from each rank's buffers (rank 0's with
        ``broadcast_buffers``), their losses averaged."""
        w = self.world_size
        if not coupled:
            loss = training_loss(self.model, self.forward(x), y)
            return loss, [[b.clone() for b in self.bufs()] for _ in range(w)]
        loss, after = 0.0, []
        for r in range(w):
            self.set_bufs(rank_bufs[0] if broadcast_buffers else rank_bufs[r])
            with _stream(self.net, self.streams, r):
                out = self.forward(shard(x, r, w))
            loss = loss + training_loss(self.model, out, shard(y, r, w)) / w
            after.append([b.clone() for b in self.bufs()])
        return loss, after


@functools.lru_cache(maxsize=32)
def _reference(model, lr, steps, global_batch_size, seed, world_size, broadcast_buffers,
               momentum=0.0, autocast="", sync_bn=False, quirks=frozenset()):
    coupled = _per_shard(model, sync_bn)
    ref = _ReferenceNet(model, seed, world_size, autocast, sync_bn, quirks)
    net = ref.net
    opt = build_optimizer("sgd", net.parameters(), lr, momentum)
    # Without broadcast_buffers nothing aligns the buffers: rank r keeps the
    # offset the train loop gave it (rank_buffer_offset; upstream's construction sync skips buffers too).
    rank_bufs = [[b.clone() + (0 if broadcast_buffers or not b.is_floating_point()
                               else rank_buffer_offset(r)) for b in ref.bufs()]
                 for r in range(world_size)]
    params, losses = [flat_params(net)], []
    buffers = [ref.flat_buffers(rank_bufs)]
    for step in range(steps):
        x, y = global_batch(model, seed, step, global_batch_size)
        opt.zero_grad(set_to_none=True)
        loss, rank_bufs = ref.loss(x, y, rank_bufs, broadcast_buffers, coupled)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        params.append(flat_params(net))
        buffers.append(ref.flat_buffers(rank_bufs))
    return {"params": np.stack(params), "losses": np.asarray(losses), "buffers": np.stack(buffers),
            "optim": flat_optimizer_state(opt)}


def reference_run(spec: RunSpec, world_size: int, runtime: str | None = None) -> dict:
    """Trajectory of ``spec`` on one CPU device in float32, reproducing the :data:`QUIRKS` of
    ``runtime`` (the runtime the replicas ran on; its adapter's ``reference_quirks``). Returns
    ``params`` float32 ``[steps+1, P]``, ``losses`` float64 ``[steps]`` (the global-batch loss),
    ``buffers`` float64 ``[steps+1, world_size, B]`` (each rank's after each step). Cached."""

    over = {}
    for name in spec.setups:
        over.update(SETUPS[name].reference)
    autocast, sync_bn = over.get("autocast", ""), over.get("sync_bn", False)
    w = world_size if _per_shard(spec.model, sync_bn) else 1
    quirks = frozenset()
    if runtime is not None:
        from conformance.worlds.runtimes import get_runtime
        quirks = frozenset(get_runtime(runtime).reference_quirks)
    out = _reference(spec.model, spec.lr, spec.steps, spec.global_batch, spec.seed, w,
                     spec.broadcast_buffers, spec.momentum, autocast, sync_bn, quirks)
    if w != world_size:
        out = dict(out, buffers=np.repeat(out["buffers"], world_size, axis=1))
    return out
