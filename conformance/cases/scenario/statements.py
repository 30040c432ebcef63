"""The statement table of the loop programs: what a surveyed training program does around the DDP
(docs/programs.md: the program, its source, which statement covers it), one row per statement.

A statement is a loop dimension (the scenario JSON's ``loop`` object holds its value; the first
value is the plain one Hypothesis shrinks towards) whose behaviour lives in its row's hooks, which
the replica loop (:func:`.replica.run_loop`) and the single-device oracle (:func:`.oracle.loop_reference`)
both call, so a new statement is a new row here and nothing else:

* ``before_wrap(value, module)``: on every module built before it is wrapped (each replica's, the
  checkpoint reload's, the oracle's rank 0 module); torch's DDP reads ``requires_grad`` there.
* ``around_forward(value, module, forward)``: a context manager around a forward without backward
  (``forward``: the step's ``eval`` entry); ``module``: the wrapper on a replica, the module in the
  oracle.
* ``between(value)``: the grad mode (:func:`.dimensions.grad_mode`) of a forward of the trained
  model on the same micro-batch between each training forward and its backward, or None.
* ``after_step(value, rank, module)``: after each optimizer step, on every replica (``module``:
  the wrapper) and in the oracle (rank 0's module).
* ``rewrap(value, s, module)``: after optimizer step ``s`` (and every ``after_step``), the
  parameters of ``module`` (the one the DDP wraps, ``ddp.module``) to make trainable when the loop
  must set their ``requires_grad_(True)``, add them to the optimizer as a new group
  (``add_param_group``) and wrap the module again in a new DDP, else None; the replica loop builds
  the new DDP through the strategy, the oracle models its construction.
* ``optimized(value, params)``: the parameters the optimizer is built over, of ``params`` (every
  parameter the previous rows left).
* ``problem(value, scenario)``: why ``value`` cannot go with the rest of the scenario (validation
  refuses it; the draw leaves the statement plain there), or None.

A DDP that refuses a statement at construction (``NotImplementedError``) makes the program
``unsupported`` naming it (:func:`refusal`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Statement:
    """One row: ``key`` (the loop JSON key), ``values`` (the plain one first), ``phrases`` (how a
    verdict names each non-plain value), ``programs`` (the docs/programs.md rows it covers) and
    the hooks of the module docstring (None: the statement does nothing there)."""
    key: str
    values: tuple
    phrases: dict
    programs: tuple
    before_wrap: Callable | None = None
    around_forward: Callable | None = None
    between: Callable | None = None
    after_step: Callable | None = None
    rewrap: Callable | None = None
    optimized: Callable | None = None
    problem: Callable | None = field(default=None)


def first_layer(module):
    """The parameters of ``module``'s first child that holds any (its stem, a backbone's first
    block), or of ``module`` itself when no child does."""
    for child in module.children():
        params = list(child.parameters())
        if params:
            return params
    return list(module.parameters())


def _freeze_before_wrap(value: str, module) -> None:
    """``freeze`` ``stem``: the first layer's parameters ``requires_grad_(False)`` before wrapping
    (fine-tuning with a frozen backbone): torch's DDP broadcasts them at construction like any
    parameter (``_sync_module_states`` over ``named_parameters()``) and reduces only those that
    require grad; the optimizer, over every parameter, skips their ``None`` gradients."""
    if value == "stem":
        for p in first_layer(module):
            p.requires_grad_(False)


def _freeze_problem(value: str, sc) -> str | None:
    if value != "none" and sc.workload.get("graph") == "checkpoint_reentrant":
        return ("a frozen stem feeds the reentrant checkpoint inputs that need no grad, which leaves its "
                "branches without gradients (torch warns 'None of the inputs have requires_grad=True')")
    return None


def _unfreeze_stem(value: str, s: int, module) -> list | None:
    """``unfreeze`` ``rewrap``: after the first optimizer step the stem frozen before wrapping
    (``freeze`` ``stem``) is made trainable, added to the optimizer (``add_param_group``:
    Lightning's ``BackboneFinetuning``, the torchvision / HF recipes that unfreeze the backbone
    after N epochs) and the module is wrapped again in a new DDP, because torch's DDP reads
    ``requires_grad`` at construction only (its reducer holds the parameters that required grad
    then; mrshenli on discuss.pytorch.org/t/90736). The new DDP broadcasts parameters and buffers
    at construction, its first forward broadcasts the buffers, and it reduces the stem."""
    return first_layer(module) if value == "rewrap" and s == 0 else None


def _trainable_only(value: str, params) -> list:
    """``unfreeze`` ``rewrap``: the optimizer over the trainable parameters only (the recipes'
    ``params_to_update``; the stem joins it by ``add_param_group`` when unfrozen)."""
    return [p for p in params if p.requires_grad] if value == "rewrap" else list(params)


def _unfreeze_problem(value: str, sc) -> str | None:
    if value == "none":
        return None
    if sc.loop.get("freeze", "none") != "stem":
        return "unfreezes the stem frozen before wrapping: it needs loop freeze 'stem'"
    if len(sc.steps) < 2:
        return "unfreezes after the first step: a one-step program never trains the new DDP"
    if sc.checkpoint_at is not None:
        return ("the checkpoint reload builds the module anew with its stem frozen, while the saved "
                "optimizer holds the unfrozen stem's group")
    return None


@contextlib.contextmanager
def _frozen_forward(value: str, module, forward: dict):
    """``toggle`` ``frozen``: a grad-enabled forward without backward runs with every parameter
    ``requires_grad_(False)`` (a GAN's discriminator during the generator step, Lightning's
    ``toggle_optimizer``; restored after). torch's DDP arms the next forward's buffer broadcast
    on grad mode and ``no_sync`` alone (``_post_forward``: ``torch.is_grad_enabled() and
    require_backward_grad_sync``), never on ``requires_grad``."""
    params = list(module.parameters()) if value == "frozen" and forward["grad"] == "enabled" else []
    kept = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, k in zip(params, kept):
            p.requires_grad_(k)


def _target_forward(value: str) -> str | None:
    """``peek`` ``no_grad``: a ``no_grad`` forward of the trained model on the micro-batch between
    its training forward and its backward (``out = model(x); with torch.no_grad(): t = model(x)``:
    FixMatch pseudo-labels, a mean teacher sharing the model, self-distillation targets), in the
    training mode; its output is judged with the evaluation outputs. torch's DDP arms the reducer
    in grad-enabled forwards only (``_pre_forward`` / ``_post_forward`` under
    ``torch.is_grad_enabled()``), so the backward still reduces, and the no_grad forward leaves
    the next forward's buffer broadcast off (``require_forward_param_sync = False``)."""
    return "no_grad" if value == "no_grad" else None


def _save_on_rank0(value: str, rank: int, module) -> None:
    """``save`` ``rank0``: after each optimizer step rank 0 alone serializes ``state_dict()``
    (``if rank == 0: torch.save(model.state_dict(), path)``: the PyTorch DDP tutorial, the HF
    Trainer and Lightning save on the main process) and training goes on. torch's DDP's
    ``state_dict()`` is ``nn.Module``'s: no collective, no state changed."""
    if value == "rank0" and rank == 0:
        import io

        import torch
        torch.save(module.state_dict(), io.BytesIO())


#: The statements, in the loop JSON's order.
STATEMENTS = (
    Statement("freeze", ("none", "stem"),
              {"stem": "the first layer frozen (requires_grad_(False)) before wrapping"},
              ("torchvision finetuning", "HF Trainer", "Lightning BackboneFinetuning"),
              before_wrap=_freeze_before_wrap, problem=_freeze_problem),
    Statement("unfreeze", ("none", "rewrap"),
              {"rewrap": "the frozen stem unfrozen after the first step, added to the optimizer "
                         "(add_param_group) and the module wrapped again in a new DDP"},
              ("fine-tuning: unfreeze and re-wrap", "Lightning BackboneFinetuning"),
              rewrap=_unfreeze_stem, optimized=_trainable_only, problem=_unfreeze_problem),
    Statement("toggle", ("none", "frozen"),
              {"frozen": "every parameter frozen (requires_grad_(False)) for each grad-enabled forward "
                         "without backward, restored after (a GAN's D during the G step)"},
              ("DCGAN / CycleGAN", "Lightning toggle_optimizer"),
              around_forward=_frozen_forward),
    Statement("peek", ("none", "no_grad"),
              {"no_grad": "a no_grad forward of the trained model between each training forward and its "
                          "backward (pseudo-labels, a mean teacher sharing the model)"},
              ("FixMatch / pseudo-labelling", "mean teacher / self-distillation"),
              between=_target_forward),
    Statement("save", ("none", "rank0"),
              {"rank0": "rank 0 alone serializes state_dict() after each optimizer step (checkpointing "
                        "on the main process)"},
              ("PyTorch DDP tutorial", "HF Trainer", "Lightning ModelCheckpoint"),
              after_step=_save_on_rank0),
)
BY_KEY = {s.key: s for s in STATEMENTS}


def statement_values() -> dict:
    """``{key: values}`` of every statement (merged into the loop dimensions)."""
    return {s.key: s.values for s in STATEMENTS}


def statement_phrases() -> dict:
    """``{(key, value): phrase}`` of every non-plain value."""
    return {(s.key, v): p for s in STATEMENTS for v, p in s.phrases.items()}


def before_wrap(loop: dict, module) -> None:
    """Every statement's ``before_wrap`` on ``module`` for the values in ``loop``."""
    for s in STATEMENTS:
        if s.before_wrap is not None:
            s.before_wrap(loop.get(s.key, s.values[0]), module)


def around_forward(loop: dict, module, forward: dict):
    """One context manager holding every statement's ``around_forward`` for ``forward``."""
    stack = contextlib.ExitStack()
    for s in STATEMENTS:
        if s.around_forward is not None:
            stack.enter_context(s.around_forward(loop.get(s.key, s.values[0]), module, forward))
    return stack


def between(loop: dict) -> list[str]:
    """The grad modes of the forwards between a training forward and its backward, in table order."""
    out = []
    for s in STATEMENTS:
        mode = s.between(loop.get(s.key, s.values[0])) if s.between is not None else None
        if mode:
            out.append(mode)
    return out


def after_step(loop: dict, rank: int, module) -> None:
    """Every statement's ``after_step`` for the values in ``loop``."""
    for s in STATEMENTS:
        if s.after_step is not None:
            s.after_step(loop.get(s.key, s.values[0]), rank, module)


def rewrap(loop: dict, s: int, module) -> list | None:
    """The parameters the statements in ``loop`` make trainable after step ``s`` before the module
    is wrapped again in a new DDP (their ``rewrap`` hooks), or None (no new DDP)."""
    found = None
    for st in STATEMENTS:
        got = st.rewrap(loop.get(st.key, st.values[0]), s, module) if st.rewrap is not None else None
        if got is not None:
            found = (found or []) + list(got)
    return found


def optimized(loop: dict, params) -> list:
    """The parameters of ``params`` the program's optimizer is built over (every statement's
    ``optimized`` hook in turn; none: all of them)."""
    params = list(params)
    for st in STATEMENTS:
        if st.optimized is not None:
            params = st.optimized(loop.get(st.key, st.values[0]), params)
    return params


def problems(sc) -> list[str]:
    """``["loop <key> <value>: why", ...]``: the statements of ``sc`` that cannot go with the rest."""
    out = []
    for s in STATEMENTS:
        v = sc.loop.get(s.key, s.values[0])
        why = s.problem(v, sc) if s.problem is not None else None
        if why:
            out.append(f"loop {s.key} {v!r}: {why}")
    return out


def plain_where_refused(sc) -> None:
    """Set to its plain value every statement of ``sc`` that :func:`problems` refuses (the draw)."""
    for s in STATEMENTS:
        if s.problem is not None and s.problem(sc.loop.get(s.key, s.values[0]), sc):
            sc.loop[s.key] = s.values[0]


def refusal(loop: dict) -> str:
    """The non-plain statements of ``loop`` in words (what an implementation refusing them at
    construction could not serve), or ``""``."""
    return "; ".join(s.phrases[loop[s.key]] for s in STATEMENTS if loop.get(s.key, s.values[0]) != s.values[0])
