"""Models of the gradient-sync properties, built identically in replicas and in the test
process, and the readback of their gradients and state as numpy."""
from __future__ import annotations

import math

from conformance.cases.shared.readback import full


def torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[name]


def one_param_module(shape, dtype: str):
    """A module with one parameter ``p`` (zeros, ``shape``, ``dtype``) whose
    forward is ``(p * x).sum()``: the gradient of ``p`` is exactly ``x``."""
    import torch
    from torch import nn

    class OneParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(tuple(shape), dtype=torch_dtype(dtype)))

        def forward(self, x):
            return (self.p * x).sum()
    return OneParam()


def build_mlp(widths, seed: int):
    """``Linear(widths[0], widths[1]) -> Tanh -> ... -> Linear(.., widths[-1])``,
    float32, weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from ``seed``."""
    import torch
    from torch import nn
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in model:
            if isinstance(lin, nn.Linear):
                bound = 1.0 / math.sqrt(lin.in_features)
                lin.weight.uniform_(-bound, bound, generator=gen)
                lin.bias.uniform_(-bound, bound, generator=gen)
    return model


def build_bn_net(widths, seed: int):
    """``[Linear -> BatchNorm1d -> Tanh] * (len(widths) - 2) -> Linear``, every
    parameter (BatchNorm affine included) and every buffer (running mean/var,
    ``num_batches_tracked``) drawn from ``seed``, so two seeds give two
    different module states."""
    import torch
    from torch import nn
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers += [nn.BatchNorm1d(widths[i + 1]), nn.Tanh()]
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-1.0, 1.0, generator=gen)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.running_mean.normal_(generator=gen)
                m.running_var.uniform_(0.5, 2.0, generator=gen)
                m.num_batches_tracked.fill_(int(torch.randint(0, 10_000, (), generator=gen)))
    return model


def host_copy(t):
    """``t`` on the host, as the optimizer sees it: copied *before* detaching. On
    PJRT (torch_xla 2.9.0, reference DDP) a gradient accumulated under
    ``no_sync`` and then all-reduced in place reads back synced through
    ``p.grad`` (and SGD applies the synced value) but stale - the local
    accumulated gradient - through ``p.grad.detach()``. A DTensor shard (FSDP2)
    is gathered first (a collective: every replica reads the same tensors)."""
    return full(t).cpu().detach()


def grads_of(module) -> list:
    """``[(name, float32 numpy grad or None)]`` in ``parameters()`` order."""
    return [(n, None if p.grad is None else host_copy(p.grad).float().numpy().copy())
            for n, p in module.named_parameters()]


def state_of(module) -> list:
    """``[(name, numpy)]`` of every parameter and buffer, dtype preserved
    (bfloat16 as float32, exactly)."""
    import torch
    out = []
    for n, t in list(module.named_parameters()) + list(module.named_buffers()):
        t = host_copy(t)
        out.append((n, (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()))
    return out
