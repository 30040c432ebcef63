"""The cases run on a user's model (``--model package.module:factory``) and the checks of the
model itself on one device before any world starts.

The cases (:data:`USER_CASES`, ``train`` rows like the table's parity rows, and
:data:`USER_LOOP_CASE`, the loop programs of :mod:`conformance.cases.scenario.userloop`) are built
for the model's spec (the model column is the spec; :data:`fixtures.models.MODELS` loads it on
first use). ``find_unused_parameters=True`` makes the DDP walk whatever the forward returns
(dataclass, dict, tuple) to find the graph (torch/nn/parallel/distributed.py, ``_find_tensors`` /
``prepare_for_backward``). Their bound is the model's own, measured by
:mod:`conformance.cases.shared.measured`.
"""
from __future__ import annotations

import torch

from conformance.cases.shared.checks import SCENARIO_CHECKS
from conformance.cases.row import Case
from conformance.cases.train.kind import train_checks
from conformance.cases.shared.loop import RANK_SEED_STRIDE
from conformance.errors import UsageError
from conformance.cases.usermodel import UserModelError
from fixtures import build_model, global_batch, shard
from fixtures.models import MODELS, training_loss

#: The case's name and description (the ``--model`` cases, this module; run by :mod:`conformance.cases.scenario.userloop`).
USER_LOOP_CASE = (
    "scenario.user_loop",
    "the loop programs on the user's model, with its batches and loss: forwards without backward "
    "(no_grad / inference_mode, eval / train mode) before, inside and after no_sync windows, several "
    "synced backwards per step, zero_grad(set_to_none=True/False), SGD / momentum / weight decay / "
    "Adam / AdamW, clip_grad_norm_, a learning-rate drop, backward in eval mode, a checkpoint reload; "
    "every step equals DDP's semantics on one device within the bound measured on the model. The "
    "module axis (output structure, buffers, hooks, keywords, parametrizations) does not apply: the "
    "user's model is what it is")

#: (case name, description, run overrides) of the cases on a user model.
USER_CASES = (
    ("parity.user_model", "training the user's model with the DDP equals training it on one device with the "
     "global batch, step by step, within the bound measured on the model; replicas agree bit for bit", {}),
    ("parity.user_model_find_unused", "the same with find_unused_parameters=True: the DDP walks the model's "
     "output to find the used parameters", {"ddp_kwargs": (("find_unused_parameters", True),),
                                             "requires": ("find_unused_parameters",)}),
)
#: Catalog mutants ``scenario.user_loop`` fails on the test suite's transformer block
#: (tests/test_user_model.py; informational: ``--model`` runs no kill matrix). Which faults a user's
#: model reveals depends on the model: one with no unused parameter, no hook, no forward keyword and
#: constant buffers cannot show the module-axis mutants ``scenario.loop`` kills.
USER_LOOP_MUST_KILL = ("no_grad_sync", "sum_not_mean", "synced_forward_zeroes_grads", "reduce_only_in_training",
                       "output_walk_bare_tensor", "state_dict_buffers_only")
#: Relative difference allowed between the full batch's loss and the mean of its halves' losses
#: (a per-sample mean; float32 summation order differs between the two).
MEAN_LOSS_RTOL = 1e-4


def model_cases(spec: str) -> list[Case]:
    """The cases of :data:`USER_CASES` on user model ``spec`` (load it first: :func:`check_model`)."""
    out = []
    for name, description, run in USER_CASES:
        c = Case(name, "parity", description, "train", spec, train=run, tags=("user_model",),
                 must_kill=("no_grad_sync", "sum_not_mean"))
        object.__setattr__(c, "checks", train_checks(spec, c.train))  # as the table's validation does
        out.append(c)
    name, description = USER_LOOP_CASE
    out.append(Case(name, "scenario", description, "scenario", spec, args={"user_loop": True},
                    checks=tuple(SCENARIO_CHECKS), tags=("user_model", "loop"), must_kill=USER_LOOP_MUST_KILL))
    return out


def user_case_rows() -> list[tuple[str, str]]:
    """``(name, description)`` of every case ``--model`` adds (the faces' method names)."""
    return [(n, d) for n, d, _ in USER_CASES] + [USER_LOOP_CASE]


def _first_difference(a: torch.nn.Module, b: torch.nn.Module) -> str | None:
    sa, sb = ({**dict(m.named_parameters()), **dict(m.named_buffers())} for m in (a, b))
    if list(sa) != list(sb):
        return "the two modules have different parameter/buffer names"
    for n, t in sa.items():
        if t.shape != sb[n].shape or not torch.equal(t, sb[n]):
            return repr(n)
    return None


def check_model(spec: str, world_sizes) -> list[str]:
    """Load user model ``spec`` and check it on one CPU device (``build``, ``batch``, a training
    step, no random forward, a per-sample mean loss: the ``_check_*`` steps). Returns notes worth
    printing (e.g. every seed builds the same parameters).

    Raises:
        UsageError: the first problem, one line naming the model and what to fix.
    """
    where = f"--model {spec!r}"
    try:
        user = MODELS[spec].user
    except UserModelError as exc:
        raise UsageError(str(exc)) from None
    bad = [w for w in world_sizes if user.global_batch % w]
    if bad:
        raise UsageError(f"{where}: global_batch {user.global_batch} does not split evenly over world size "
                         f"{bad[0]}; give UserModel(global_batch=...) a multiple of {', '.join(map(str, world_sizes))}")
    call = _caller(where)
    m, notes = _check_build(spec, user.seed, where, call)
    x, y = _check_batch(spec, user, where, call)
    _check_training_step(spec, user, m, x, y, where, call)
    _check_not_random(spec, user, x, y, where)
    if not user.batch_coupled:  # a per-sample mean: the full batch's loss is the mean of its halves'
        _check_mean_loss(spec, user, x, y, where)
    return notes


def _caller(where: str):
    """``call(what, fn, *args)``: ``fn(*args)``, the user's code failing as a
    :class:`~conformance.errors.UsageError` naming ``what``."""
    def call(what, fn, *args):
        try:
            return fn(*args)
        except UserModelError as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:  # the user's code failing is bad input
            raise UsageError(f"{where}: {what} raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    return call


def _check_build(spec: str, seed: int, where: str, call) -> tuple:
    """``(module, notes)``: ``build(seed)`` is deterministic and has a trainable parameter; a note
    when every seed builds the same parameters."""
    m = call(f"build({seed})", build_model, spec, seed)
    diff = _first_difference(m, call(f"build({seed})", build_model, spec, seed))
    if diff:
        raise UsageError(f"{where}: build({seed}) is not deterministic: two builds differ in {diff}; "
                         "initialise from the seed (torch.Generator().manual_seed(seed)), not the global RNG")
    notes = []
    if not any(True for _ in m.parameters() if _.requires_grad):
        raise UsageError(f"{where}: build({seed}) has no parameter that requires grad: nothing to train")
    other = call(f"build({seed + RANK_SEED_STRIDE})", build_model, spec, seed + RANK_SEED_STRIDE)
    if not _first_difference(m, other):
        notes.append(f"{where}: build(seed) gives the same parameters for every seed, so a DDP that does not "
                     "broadcast rank 0's state at construction cannot be told apart")
    return m, notes


def _check_batch(spec: str, user, where: str, call) -> tuple:
    """``(x, y)``: ``batch(seed, 0, global_batch)`` gives two tensors of the global batch size,
    the same on every call."""
    seed = user.seed
    batch = call(f"batch({seed}, 0, {user.global_batch})", global_batch, spec, seed, 0, user.global_batch)
    if not (isinstance(batch, tuple) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise UsageError(f"{where}: batch(seed, step, size) must return (inputs, target), two tensors; got "
                         f"{type(batch).__name__}")
    x, y = batch
    if len(x) != user.global_batch or len(y) != user.global_batch:
        raise UsageError(f"{where}: batch(seed, step, {user.global_batch}) returned inputs of {len(x)} and a "
                         f"target of {len(y)} rows; both need {user.global_batch} (dim 0 is the sample)")
    x2, y2 = global_batch(spec, seed, 0, user.global_batch)
    if not (torch.equal(x, x2) and torch.equal(y, y2)):
        raise UsageError(f"{where}: batch(seed, step, size) is not deterministic: two calls differ; draw from a "
                         "torch.Generator seeded with (seed, step)")
    return x, y


def _check_training_step(spec: str, user, m, x, y, where: str, call) -> None:
    """A training forward of ``m`` on ``x`` keeps its buffers (unless ``batch_coupled``), its loss
    is a floating scalar with a grad_fn, and the backward reaches a parameter."""
    before = {n: b.clone() for n, b in m.named_buffers()}
    m.train()
    out = call("the forward on one CPU device", lambda: m(x, **user.forward_kwargs))
    changed = [n for n, b in m.named_buffers() if n in before and not torch.equal(b, before[n])]
    if changed and not user.batch_coupled:
        raise UsageError(f"{where}: a training forward changes buffer {changed[0]!r}; set "
                         "UserModel(batch_coupled=True) so the reference follows each replica's buffers")
    loss = call("the loss", training_loss, spec, out, y)
    if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point()):
        raise UsageError(f"{where}: the loss must be a floating scalar tensor, got "
                         f"{type(loss).__name__}{list(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
    if not loss.requires_grad:
        raise UsageError(f"{where}: the loss does not depend on any parameter (no grad_fn)")
    call("the backward", loss.backward)
    if not any(p.grad is not None for p in m.parameters()):
        raise UsageError(f"{where}: the backward gave no parameter a gradient")


def _check_not_random(spec: str, user, x, y, where: str) -> None:
    """One batch on equal builds from two generator states gives one loss (no dropout: the
    reference replays masks only for the kit's own model)."""
    twice = []
    for rng_seed in (1, 2):  # one batch on equal builds from two generator states: a random forward differs
        fresh = build_model(spec, user.seed).train()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(rng_seed)
            twice.append(float(training_loss(spec, fresh(x, **user.forward_kwargs), y)))
    if twice[0] != twice[1]:
        raise UsageError(f"{where}: the training forward is random (two forwards of one batch on equal builds "
                         f"give losses {twice[0]:.6g} and {twice[1]:.6g}: dropout?); the reference replays "
                         "dropout masks only for the kit's own model (parity.dropout): build the module "
                         "with p=0 to certify the DDP on it")


def _check_mean_loss(spec: str, user, x, y, where: str) -> None:
    """The full batch's loss is the mean of its halves' (within :data:`MEAN_LOSS_RTOL`)."""
    fresh = build_model(spec, user.seed)
    fresh.train()
    with torch.no_grad():
        def part(i):
            return float(training_loss(spec, fresh(shard(x, i, 2), **user.forward_kwargs), shard(y, i, 2)))
        full = float(training_loss(spec, fresh(x, **user.forward_kwargs), y))
        halves = (part(0) + part(1)) / 2
    if abs(full - halves) > MEAN_LOSS_RTOL * max(1.0, abs(full)):
        raise UsageError(f"{where}: the loss is not a mean over the samples (full batch {full:.6g}, mean of "
                         f"its halves {halves:.6g}): DDP averages gradients, so use reduction='mean'")
