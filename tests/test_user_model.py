"""``--model package.module:factory``: the user's own model as the cases' model (issue 25
item 4). The model is written here, outside the kit: a small transformer block (LayerNorm,
self-attention, an MLP) whose forward returns a dataclass and reads a non-persistent buffer.
torch's DDP and the reference DDP pass on it through the CLI and through pytest; a DDP that
sums instead of averaging fails with exit 1; bad specs are one ``error:`` line, exit 2."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from conformance import UserModel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = "tests.test_user_model:transformer_block"
#: Bound on one CLI run (a measured run takes well under this on a quiet 2-core machine).
CLI_TIMEOUT_S = 600


@dataclass
class BlockOut:
    """What :class:`TinyBlock` returns: ``logits`` float32 ``[batch, classes]`` and
    ``attention`` float32 ``[batch, tokens, tokens]`` (detached: needs no grad)."""

    logits: torch.Tensor
    attention: torch.Tensor


class TinyBlock(nn.Module):
    """Pre-norm transformer block on ``[batch, tokens=4, dim=8]`` float32 inputs, mean-pooled to
    3 classes. ``pos_scale`` float32 ``[4, 1]`` is a non-persistent buffer (absent from
    ``state_dict``) scaling each token: rank r's copy starts offset until the DDP broadcasts it."""

    def __init__(self, dim: int = 8, tokens: int = 4, classes: int = 3):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, num_heads=2, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 16), nn.GELU(), nn.Linear(16, dim))
        self.head = nn.Linear(dim, classes)
        self.register_buffer("pos_scale", torch.linspace(0.5, 1.5, tokens).unsqueeze(1), persistent=False)

    def forward(self, x):
        h = x * self.pos_scale
        a, w = self.attn(*(self.norm1(h),) * 3, need_weights=True)
        h = h + a
        h = h + self.mlp(self.norm2(h))
        return BlockOut(self.head(h.mean(1)), w.detach())


def _build(seed):
    torch.manual_seed(0)  # construction draws from the global RNG; every value is redrawn below
    m = TinyBlock()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return m


def _batch(seed, step, size):
    gen = torch.Generator().manual_seed(seed * 1000 + step)
    return torch.randn(size, 4, 8, generator=gen), torch.randint(0, 3, (size,), generator=gen)


def _loss(out, target):
    return nn.functional.cross_entropy(out.logits, target)


def transformer_block():
    """The factory ``--model tests.test_user_model:transformer_block`` names."""
    return UserModel(build=_build, batch=_batch, loss=_loss, lr=0.2, steps=8)


def not_a_model():
    return nn.Linear(2, 2)


def sum_loss_model():
    return UserModel(build=_build, batch=_batch,
                     loss=lambda out, t: nn.functional.cross_entropy(out.logits, t, reduction="sum"))


def broken_forward_model():
    return UserModel(build=_build, batch=lambda s, k, n: (torch.randn(n, 5), torch.zeros(n, dtype=torch.long)),
                     loss=_loss)


def _cli(*args, json_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "conformance", "run", "--quiet", "--json", str(json_path), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=CLI_TIMEOUT_S)
