"""A ZeRO-style optimizer (stage 2) on torch.distributed, certified on the CPU runtime.

No wrapper: the model is left alone. The optimizer shards SGD's state over the replicas: the
trainable parameters are flattened into one float32 vector of ``N`` elements (float64 or complex
parameters and sparse gradients are ``Unsupported``: the vector cannot hold them), padded to ``W * S``
(``S = ceil(N / W)``), and replica ``r`` owns elements ``[r*S, (r+1)*S)`` - their momentum buffer
lives on replica ``r`` only. A step reduce-scatters the flat gradient (replica ``r`` receives the
sum of its slice over the replicas), divides it by ``W``, applies ``torch.optim.SGD``'s update
(``buf = momentum * buf + grad``; ``p -= lr * buf``) to its slice, and all-gathers the updated
slices into every replica's parameters. The full state is assembled for the kit (and for
checkpoints) by all-gathering the momentum slices.

Run (from the repository root)::

    PYTHONPATH=$PWD python -m conformance run --runtime cpu --ddp examples.strategies.zero_sgd:strategy
    PYTHONPATH=$PWD python -m conformance run --runtime cpu --ddp examples.strategies.zero_sgd:faulty

``faulty`` (a zero-argument factory) forgets the division by ``W``: exit 1.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.distributed as dist

from conformance import Strategy
from conformance.errors import Unsupported

# DDP keywords with no counterpart here that leave the arithmetic unchanged (no gradient buckets).
IGNORED = frozenset({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph"})


def _all_gather(out: torch.Tensor, shard: torch.Tensor) -> None:
    # torch >= 2.11 names it all_gather_single; all_gather_into_tensor is the older name.
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, shard)


def wrap(module: torch.nn.Module, ctx, ddp_kwargs: dict) -> torch.nn.Module:
    """Leave the model alone; give every replica rank 0's parameters (and buffers), as DDP's
    construction does, and with ``broadcast_buffers`` rank 0's buffers before every training
    forward. A keyword without a counterpart raises ``TypeError`` (the case is unsupported)."""
    unknown = sorted(set(ddp_kwargs) - IGNORED - {"broadcast_buffers"})
    if unknown:
        raise TypeError(f"zero_sgd has no counterpart for keyword(s) {', '.join(unknown)}")
    broadcast_buffers = ddp_kwargs.get("broadcast_buffers", True)
    with torch.no_grad():
        for t in list(module.parameters()) + (list(module.buffers()) if broadcast_buffers else []):
            dist.broadcast(t, src=0)
    if broadcast_buffers and any(True for _ in module.buffers()):
        def sync_buffers(mod, args):
            if torch.is_grad_enabled():
                with torch.no_grad():
                    for b in mod.buffers():
                        dist.broadcast(b, src=0)
        module.register_forward_pre_hook(sync_buffers)
    return module


class ShardedSGD(torch.optim.Optimizer):
    """SGD (``torch.optim.SGD`` semantics, dampening 0, no Nesterov or weight decay) whose momentum
    is sharded over the replicas of the default process group (module docstring).

    Args:
        params: the model's parameters (one group); those with ``requires_grad`` are trained.
        lr: learning rate.
        momentum: momentum factor (0: no state).
        divide: divide the reduce-scattered gradient sum by the world size (``False`` is the
            faulty variant).
    """

    def __init__(self, params, lr: float, momentum: float = 0.0, divide: bool = True):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": 0.0, "weight_decay": 0.0,
                                  "nesterov": False, "maximize": False})
        if len(self.param_groups) != 1:
            raise ValueError("ShardedSGD takes one parameter group")
        self.divide = divide
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.trained = [p for p in self.param_groups[0]["params"] if p.requires_grad]
        wide = sorted({str(p.dtype) for p in self.trained if p.is_complex() or p.element_size() > 4})
        if wide:  # a float32 flat vector would drop precision or the imaginary part
            raise Unsupported(f"zero_sgd flattens parameters into one float32 vector: {', '.join(wide)} "
                              "parameters are not representable")
        numel = sum(p.numel() for p in self.trained)
        self.slice = math.ceil(numel / self.world)       # S: elements each replica owns
        self.padded = self.slice * self.world             # W * S >= N
        self.buf: torch.Tensor | None = None              # this replica's momentum slice, [S]

    def _flat(self, tensors) -> torch.Tensor:
        flat = torch.zeros(self.padded, dtype=torch.float32)
        flat[:sum(t.numel() for t in tensors)] = torch.cat([t.detach().reshape(-1).float() for t in tensors])
        return flat

    def _unflatten_into(self, flat: torch.Tensor, tensors) -> None:
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce-scatter the gradients, update the owned slice, all-gather the parameters.
        A collective: every replica calls it. A missing gradient counts as zeros."""
        group = self.param_groups[0]
        if any(p.grad is not None and p.grad.is_sparse for p in self.trained):
            raise Unsupported("zero_sgd reduce-scatters one dense flat gradient: sparse gradients "
                              "(Embedding(sparse=True)) are not supported")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.trained]
        grad = torch.empty(self.slice)
        dist.reduce_scatter_tensor(grad, self._flat(grads))   # SUM of this replica's slice
        if self.divide:
            grad.div_(self.world)
        update = grad
        if group["momentum"]:
            self.buf = grad.clone() if self.buf is None else self.buf.mul_(group["momentum"]).add_(grad)
            update = self.buf
        params = self._flat(self.trained)
        mine = params[self.rank * self.slice:(self.rank + 1) * self.slice]
        mine.add_(update, alpha=-group["lr"])
        _all_gather(params, mine.clone())
        self._unflatten_into(params, self.trained)

    def full_state_dict(self) -> dict:
        """``torch.optim.SGD.state_dict()``'s form, on every replica (all-gathers the momentum
        slices; a collective): ``{"state": {i: {"momentum_buffer": Tensor}}, "param_groups": [...]}``,
        ``i`` the parameter's index, each buffer shaped like its parameter."""
        sd = super().state_dict()
        sd["state"] = {}
        if self.param_groups[0]["momentum"] and self.buf is not None:
            full = torch.empty(self.padded)
            _all_gather(full, self.buf)
            bufs = [torch.empty_like(p, dtype=torch.float32) for p in self.trained]
            self._unflatten_into(full, bufs)
            index = {id(p): i for i, p in enumerate(self.param_groups[0]["params"])}
            sd["state"] = {index[id(p)]: {"momentum_buffer": b} for p, b in zip(self.trained, bufs)}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full state dict (:meth:`full_state_dict`'s form): keep this replica's slice."""
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        index = {id(p): i for i, p in enumerate(self.param_groups[0]["params"])}
        bufs = [state_dict["state"].get(index[id(p)], {}).get("momentum_buffer") for p in self.trained]
        if any(b is None for b in bufs):
            self.buf = None
            return
        full = self._flat(bufs)
        self.buf = full[self.rank * self.slice:(self.rank + 1) * self.slice].clone()


def make_optimizer(params, run, divide: bool = True) -> ShardedSGD:
    return ShardedSGD(params, lr=run.lr, momentum=run.momentum, divide=divide)


strategy = Strategy(
    description="ZeRO-2-style SGD on torch.distributed: no wrapper, momentum sharded over replicas, "
                "gradients reduce-scattered and parameters all-gathered in optimizer.step()",
    wrap=wrap,
    make_optimizer=make_optimizer,
    optimizer_state_dict=lambda optimizer, ctx: optimizer.full_state_dict(),
    ignores=IGNORED,
    unsupported={"pjrt": "written on torch.distributed (gloo); run it with --runtime cpu",
                 "xrt": "written on torch.distributed (gloo); run it with --runtime cpu"},
    unsupported_kinds={"property": "gradients are reduce-scattered inside optimizer.step(): after backward "
                                   "a replica holds its local gradient, not the synchronised one the "
                                   "gradient properties read"},
    not_transparent={"module_hooks": "no wrapper: the buffer broadcast before a training forward is a "
                                     "forward pre-hook registered on the module itself"},
)


def faulty() -> Strategy:
    """The same strategy with one fault: the reduce-scattered gradient sum is not divided by W."""
    return dataclasses.replace(strategy, make_optimizer=functools.partial(make_optimizer, divide=False))
