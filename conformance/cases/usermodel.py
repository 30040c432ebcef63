"""The user's own model: what ``--model package.module:factory`` names (public:
``conformance.UserModel``).

With ``--model`` (CLI, ``--conformance-model`` under pytest, ``--model`` under absltest) the
parity, agreement and loop-program cases run on a module the user builds, with the user's data
and loss, at a tolerance the kit measures on that model (docs/configuration.md, "Your own
model"). ``factory`` is a :class:`UserModel` or a zero-argument callable returning one.

This module imports neither torch nor the rest of the kit: the faces read it while parsing.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable


class UserModelError(ValueError):
    """A ``--model`` spec that cannot be used; ``str(exc)`` is the one line printed after
    ``error:`` (exit 2)."""


@dataclass(frozen=True)
class UserModel:
    """A model the user certifies a DDP on.

    Attributes:
        build: ``build(seed: int) -> torch.nn.Module``: a new module on CPU, its parameters
            initialised deterministically from ``seed`` (use a ``torch.Generator`` seeded with
            it, not the global RNG). Replica ``r`` builds from another seed than rank 0, so
            only a DDP that broadcasts the module's state at construction matches the
            reference; two builds from one seed must be identical (checked).
        batch: ``batch(seed: int, step: int, size: int) -> (inputs, target)``: the *global*
            batch of training step ``step`` (0-based), deterministic in its arguments and
            independent of the world size: ``inputs`` a tensor ``[size, ...]``, ``target`` a
            tensor ``[size, ...]``. Replica ``r`` of ``W`` trains on rows
            ``[r*size/W, (r+1)*size/W)`` of both (dim 0 is the sample dimension).
        loss: ``loss(output, target) -> scalar tensor``: the mean over the samples of the batch
            (with equal shards only a per-sample mean makes the replicas' averaged gradient the
            global batch's: torch's ``DistributedDataParallel`` docstring, "gradients ...
            averaged"; checked where samples do not interact). ``None``: ``mse_loss`` of
            ``prediction(output)`` and ``target``.
        prediction: ``prediction(output) -> tensor``: the tensor the default loss reads from a
            forward's output (a dataclass, dict, tuple...). ``None``: the output itself. Unused
            when ``loss`` is given.
        forward_kwargs: keyword arguments of every training forward (``ddp(inputs, **kw)``).
        batch_coupled: the forward mixes the samples of a batch or updates buffers from the
            batch (BatchNorm, a running mean): the single-device reference then runs each
            replica's shard separately (DDP without SyncBatchNorm). Buffers are compared
            whenever the module has any.
        lr, steps, global_batch, seed: the training run (SGD at ``lr``, ``steps`` steps of
            ``global_batch`` samples; ``global_batch`` must split evenly over every world size
            run: the default 24 over 2, 3, 4, 6, 8).
    """

    build: Callable
    batch: Callable
    loss: Callable | None = None
    prediction: Callable | None = None
    forward_kwargs: dict = field(default_factory=dict)
    batch_coupled: bool = False
    lr: float = 0.1
    steps: int = 10
    global_batch: int = 24
    seed: int = 1234

    def __post_init__(self):
        for name in ("build", "batch"):
            if not callable(getattr(self, name)):
                raise UserModelError(f"UserModel.{name} must be callable, got {type(getattr(self, name)).__name__}")
        for name in ("loss", "prediction"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise UserModelError(f"UserModel.{name} must be callable or None, got "
                                     f"{type(getattr(self, name)).__name__}")
        if not isinstance(self.forward_kwargs, dict):
            raise UserModelError("UserModel.forward_kwargs must be a dict")
        if not (isinstance(self.steps, int) and self.steps >= 1 and isinstance(self.global_batch, int)
                and self.global_batch >= 2 and self.lr > 0):
            raise UserModelError(f"UserModel: need steps >= 1, global_batch >= 2 and lr > 0, got steps="
                                 f"{self.steps!r}, global_batch={self.global_batch!r}, lr={self.lr!r}")


#: The prefix of the kit's zoo of real models (``--model zoo:NAME``, :mod:`fixtures.zoo`): a
#: reserved top-level name, never imported as the user's package.
ZOO_PREFIX = "zoo:"


def is_model_spec(name: str) -> bool:
    """Whether ``name`` is a ``package.module:factory`` or ``zoo:NAME`` spec (the kit's models
    have no colon)."""
    return isinstance(name, str) and ":" in name


def load_user_model(spec: str) -> UserModel:
    """The :class:`UserModel` that ``spec`` (``package.module:attr``) names: the attribute
    itself, or what calling it with no arguments returns.

    Raises:
        UserModelError: the module does not import, has no such attribute, the attribute is
            neither a UserModel nor callable, calling it raises or returns something else.
    """
    mod_name, colon, attr = spec.partition(":")
    where = f"--model {spec!r}"
    if not (colon and mod_name and attr):
        raise UserModelError(f"{where}: give package.module:factory")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # any import-time error is the user's spec failing
        raise UserModelError(f"{where}: cannot import {mod_name!r}: {type(exc).__name__}: {exc}") from None
    if not hasattr(mod, attr):
        raise UserModelError(f"{where}: module {mod_name!r} has no {attr!r}")
    obj = getattr(mod, attr)
    if isinstance(obj, UserModel):
        return obj
    if not callable(obj):
        raise UserModelError(f"{where}: {attr!r} is a {type(obj).__name__}, neither a conformance.UserModel "
                             "nor a zero-argument factory of one")
    try:
        got = obj()
    except UserModelError as exc:
        raise UserModelError(f"{where}: {exc}") from None
    except Exception as exc:
        raise UserModelError(f"{where}: {attr}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(got, UserModel):
        raise UserModelError(f"{where}: {attr}() returned a {type(got).__name__}, not a conformance.UserModel "
                             "(build(seed) -> nn.Module, batch(seed, step, size) -> (inputs, target), ...)")
    return got
