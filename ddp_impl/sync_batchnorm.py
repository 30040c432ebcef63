"""SyncBatchNorm over the :class:`~ddp_impl.runtime.collectives.Collectives` interface.

Semantics of ``torch.nn.SyncBatchNorm`` (which refuses CPU tensors): in training
the batch statistics are those of the *global* batch (all replicas' samples),
running statistics are updated with the global mean and the unbiased global
variance, and the backward all-reduces the two per-channel sums it needs, so
that after DDP averages parameter gradients every replica holds the gradient
of BatchNorm on the global batch. Works for any runtime that has collectives
(gloo on CPU here).
"""
from __future__ import annotations

import torch
from torch import nn


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, count, collectives):
        ctx.collectives = collectives
        shape = [1, -1] + [1] * (x.dim() - 2)
        xhat = (x - mean.view(shape)) * invstd.view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.count = count
        return xhat * weight.view(shape) + bias.view(shape)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        shape = [1, -1] + [1] * (dy.dim() - 2)
        dims = [0] + list(range(2, dy.dim()))
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        # Global sums: every replica's loss depends on every replica's input.
        both = ctx.collectives.all_reduce_(torch.cat([sum_dy, sum_dy_xhat]))
        g_dy, g_dy_xhat = both.split(sum_dy.numel())
        n = ctx.count
        dx = (weight * invstd).view(shape) * (dy - g_dy.view(shape) / n - xhat * g_dy_xhat.view(shape) / n)
        return dx, sum_dy_xhat, sum_dy, None, None, None, None


class SyncBatchNorm(nn.BatchNorm1d):
    """BatchNorm whose training statistics span every replica.

    Input ``[N, C]`` or ``[N, C, L]`` (any trailing dims), floating dtype;
    ``N`` may differ between replicas. Evaluation mode uses running statistics.

    Args:
        num_features: ``C``.
        collectives: the replicas' :class:`~ddp_impl.runtime.collectives.Collectives`
            (default: :func:`~ddp_impl.runtime.collectives.default_collectives` at first use).
        eps, momentum, affine, track_running_stats: as ``nn.BatchNorm1d``
            (``momentum=None`` is not supported).

    Raises:
        ValueError: ``momentum=None`` or ``affine=False``.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, collectives=None):
        if momentum is None or not affine:
            raise ValueError("SyncBatchNorm supports a float momentum and affine=True only")
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.collectives = collectives

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def _global_stats(self, x):
        dims = [0] + list(range(2, x.dim()))
        local_n = torch.tensor([x.numel() / x.shape[1]], dtype=x.dtype, device=x.device)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), local_n])
        stats = self.collectives.all_reduce_(stats.detach())
        c = x.shape[1]
        total_n = stats[-1]
        mean = stats[:c] / total_n
        var = stats[c:2 * c] / total_n - mean * mean
        return mean, var.clamp_min(0), total_n

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training:
            return super().forward(x)
        if self.collectives is None:
            from ddp_impl.runtime.collectives import default_collectives
            self.collectives = default_collectives()
        mean, var, n = self._global_stats(x)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum
                self.running_mean.mul_(1 - m).add_(m * mean)
                self.running_var.mul_(1 - m).add_(m * var * n / (n - 1))
        invstd = torch.rsqrt(var + self.eps)
        return _SyncBatchNormFn.apply(x, self.weight, self.bias, mean, invstd, n, self.collectives)

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, collectives=None) -> nn.Module:
        """Replace every ``nn.BatchNorm*d`` in ``module`` (copying state), like
        ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``; returns the module."""
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            new = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, collectives)
            new.load_state_dict(module.state_dict())
            return new.to(module.weight.device)
        for name, child in module.named_children():
            module.add_module(name, cls.convert_sync_batchnorm(child, collectives))
        return module
