"""Generated training scenarios: data, the replica task, the single-device oracle, the judge.

A **scenario** is JSON-serialisable data: a sequence of optimizer steps, each an
accumulation window of ``k`` micro-steps (the first ``k - 1`` under ``no_sync()``,
the last synced), and for every micro-step and replica a local batch size
(uneven allowed) and a *plan*: which branches of the scenario model the replica
uses and in which order (rank-dependent control flow, so gradient hooks fire in
rank-dependent orders and parameters go unused on some replicas). Around it: DDP
keywords (``find_unused_parameters``, ``broadcast_buffers``, buckets, a comm
hook), buffer rebinding in forward, a loss scale (gradients up to where fp16
communication overflows; unscaled before the step, as ``GradScaler`` does), the
optimizer (SGD, SGD with momentum, Adam, AdamW), a checkpoint save/reload of
DDP + optimizer state mid-run, and the length (up to 120 steps).

The oracle computes **DDP's semantics** on one device for any scenario: every
replica's accumulated gradient over the window (its own micro-batches, its own
local-mean losses), then the equal average over replicas (not the global-batch
gradient: with uneven local batches the two differ). A parameter no replica used
in the whole window keeps no gradient (``find_unused_parameters``: globally
unused); one used only by some replicas, or only in the ``no_sync`` micro-steps,
is averaged with zeros from the others. Buffers follow torch's DDP: with
``broadcast_buffers`` a forward starts from rank 0's buffers when the previous
forward was synced (or it is the first), i.e. at the start of an accumulation
window (``torch.nn.parallel.DistributedDataParallel._pre_forward`` /
``_post_forward``: ``require_forward_param_sync``).

The scenario model's buffers do not feed its output (an exponential moving
average of the stem activations and a forward counter), so buffer semantics are
judged by the buffer check and cannot mask a gradient fault.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from conformance.cases.checks import AGREEMENT, CHECKS, SCENARIO_CHECKS, judge, judge_agreement
from conformance.cases.kinds import Kind
from conformance.cases.train.loop import ALL_OPTIMIZERS, OPTIMIZERS, build_optimizer, mse, rank_buffer_offset, rank_seed, wrap
from conformance.cases.train.readback import (buffer_layout, flat_buffers, flat_optimizer_state, flat_params,
                                              optimizer_state_layout, param_layout, saved_checkpoint, state_digest,
                                              to_device)
import contextlib
from conformance.cases.search import (kit_settings, loop_depth, loop_examples, scenario_examples, SearchWorld,
                                      workload_examples)
from conformance.cases.train.commhooks import register_hook
from conformance.errors import Unsupported
from conformance.impls.builtin import resolve_impl
from conformance.tolerances import lookup
from conformance.verdict import Verdict
from conformance.worlds.runtimes import get_runtime

#: Branches of the scenario model; a plan uses a subset, in an order.
BRANCHES = ("a", "b", "c")
#: Fault kinds each optimizer can reveal (docs and report): Adam's update is
#: invariant to a constant gradient scale, so a mean/sum or world-size-count fault
#: is nearly invisible under it; SGD reveals it in proportion.
OPTIMIZER_REVEALS = {
    "sgd": "every gradient fault, scale faults (sum instead of mean, wrong count) in proportion",
    "sgd_momentum": "as SGD, plus momentum-buffer (optimizer state) faults, e.g. after a checkpoint reload",
    "adam": "per-element direction faults and state faults; NOT constant scale faults (update is scale-invariant)",
    "adamw": "as Adam, plus weight-decay handling",
    "sgd_wd": "as SGD, plus a None gradient told from a zero one (weight decay moves a parameter with a zero gradient)",
}
IN_FEATURES, HIDDEN, OUT_FEATURES = 8, 12, 4
SCENARIO_KEYS = {"seed", "lr", "optimizer", "ddp", "rebind_buffers", "loss_scale_log2", "checkpoint_at",
                 "steps", "workload", "loop", "module"}
#: Scenario keys a JSON file may leave out (older files: the plain workload, loop and module).
OPTIONAL_KEYS = {"workload", "loop", "module"}
DDP_KEYS = {"find_unused_parameters", "broadcast_buffers", "bucket_cap_mb", "gradient_as_bucket_view",
            "static_graph", "comm_hook"}
STEP_KEYS = {"micro"}
#: Keys a step may add (the loop programs): forwards without backward before its micro-steps.
STEP_OPTIONAL = {"eval"}
MICRO_KEYS = {"batch", "plan"}
#: Keys a micro-step may add: ``sync`` (default: only the window's last micro-step is synced,
#: the others run under ``no_sync()``; true: a synced backward of its own).
MICRO_OPTIONAL = {"sync"}

#: The loop dimension (issue 25; docs/scenarios.md, "The loop programs"): what a user's training
#: loop does around the DDP besides forward, backward and ``optimizer.step()``. Each key's first
#: value is the plain loop Hypothesis shrinks towards.
#:   zero_grad:   ``optimizer.zero_grad(set_to_none=True)`` or ``(set_to_none=False)``: zero
#:                tensors, which a parameter no replica used keeps (weight decay and momentum then
#:                still move it; a ``None`` gradient skips it);
#:   module_mode: the module's mode at the training forwards: ``train``, or ``eval`` (a backward in
#:                eval mode is legal: fine-tuning with frozen statistics; the buffers then stay);
#:   clip:        ``none``, or ``norm``: ``torch.nn.utils.clip_grad_norm_(max_norm=CLIP_NORM)`` on
#:                the synced, unscaled gradients before the step (it reads every replica's
#:                gradients: a reduction not finished by then shows);
#:   lr_drop_at:  ``None``, or the 0-based step from which the learning rate is ``lr * LR_DROP``
#:                (set in the optimizer's ``param_groups`` before the step, as a scheduler does).
LOOPS = {"zero_grad": ("set_to_none", "zeros"), "module_mode": ("train", "eval"), "clip": ("none", "norm")}
PLAIN_LOOP = dict({k: v[0] for k, v in LOOPS.items()}, lr_drop_at=None)
CLIP_NORM, LR_DROP = 0.25, 0.5
#: The module dimension drawn with the loop programs (issue 25; docs/scenarios.md): what the user's
#: module looks like to the DDP. First values: the plain module.
#:   output:  forward returns the prediction tensor, a dict ``{"pred", "hidden" (detached), "note" (a
#:            str)}`` or a :class:`ScenarioOutput` dataclass (``pred``, ``hidden``, ``calls``: an int);
#:            the loss reads ``pred`` (``find_unused_parameters`` must walk the structure);
#:   buffers: ``ema`` registered ``persistent`` or ``non_persistent`` (absent from ``state_dict()``:
#:            a checkpoint reload leaves the new module's own, as construction made it);
#:   hook:    ``none`` or ``pre_hook``: a forward pre-hook on the wrapped module halves the input
#:            (it runs only when the wrapper calls ``module(...)``).
MODULES = {"output": ("tensor", "dict", "dataclass"), "buffers": ("persistent", "non_persistent"),
           "hook": ("none", "pre_hook")}
PLAIN_MODULE = {k: v[0] for k, v in MODULES.items()}
MODULE_PHRASES = {"dict": "forward returns a dict (the loss reads 'pred')",
                  "dataclass": "forward returns a dataclass (the loss reads field 'pred')",
                  "non_persistent": "buffer 'ema' registered persistent=False (not in state_dict())",
                  "pre_hook": "a forward pre-hook on the wrapped module"}


@dataclass
class ScenarioOutput:
    """The scenario model's output with ``module["output"] == "dataclass"``: ``pred`` ``[n,
    OUT_FEATURES]`` (what the loss reads), ``hidden`` ``[n, HIDDEN]`` detached, ``calls`` an int (forwards so far)."""
    pred: object
    hidden: object
    calls: int


def prediction_of(out):
    """The tensor the loss reads from a scenario model's output (:data:`MODULES` ``output``)."""
    return out.pred if isinstance(out, ScenarioOutput) else out["pred"] if isinstance(out, dict) else out


#: A forward without backward (``step["eval"]``): ``{"at": j, "grad": ..., "mode": ..., "batch": [n
#: per replica]}`` runs before micro-step ``j`` (``j`` = the window's length: after the last
#: backward, before the step) under ``grad`` with the module in ``mode``, through the DDP, output
#: discarded. In ``train`` mode it updates the buffers (a metric computed under ``no_grad`` in train
#: mode); DDP then broadcasts buffers at the next forward only if this one was a synced training
#: forward, which it is not (``_post_forward``: ``require_forward_param_sync``).
EVAL_KEYS = {"at", "grad", "mode", "batch"}
EVAL_GRAD = ("no_grad", "inference_mode")
EVAL_MODE = ("eval", "train")
#: Data of a forward without backward: micro index ``EVAL_DATA + e`` (apart from the micro-steps').
EVAL_DATA = 1000


#: The workload dimension (issue 18; docs/scenarios.md): what the scenario model's parameters
#: and graph are. Each key's first value is the plain workload Hypothesis shrinks towards
#: (dense, contiguous float32 parameters, each branch applied once).
#:   dtype:  float64 (the whole model and its loss), complex64 (branch ``b``), bfloat16
#:           (branch ``b`` between float32 layers);
#:   layout: channels_last (the stem is a conv with a channels_last weight), transposed (the
#:           head's weight is a non-contiguous transposed view);
#:   grad:   sparse (an ``Embedding(sparse=True)`` added to the stem), sparse_bag (an
#:           ``EmbeddingBag(mode="mean", sparse=True)``);
#:   graph:  applied_twice (each planned branch twice, each adding half), shared (branches ``a`` and ``c``
#:           share one weight), checkpoint_nonreentrant / checkpoint_reentrant (each planned
#:           branch twice, each application under its own activation checkpoint: with
#:           ``use_reentrant=True`` a branch's gradient hook fires twice in one backward).
WORKLOADS = {
    "dtype": ("float32", "float64", "complex64", "bfloat16"),
    "layout": ("contiguous", "channels_last", "transposed"),
    "grad": ("dense", "sparse", "sparse_bag"),
    "graph": ("plain", "applied_twice", "shared", "checkpoint_nonreentrant", "checkpoint_reentrant"),
}
PLAIN_WORKLOAD = {k: v[0] for k, v in WORKLOADS.items()}
#: How a verdict names each corner (the dimensions in play).
WORKLOAD_PHRASES = {
    "float64": "float64 model and loss", "complex64": "complex64 branch b",
    "bfloat16": "bfloat16 branch b between float32 layers",
    "channels_last": "channels_last conv stem", "transposed": "transposed (non-contiguous) head weight",
    "sparse": "sparse gradient (Embedding(sparse=True))", "sparse_bag": "sparse gradient (EmbeddingBag(sparse=True))",
    "applied_twice": "each branch applied twice", "shared": "branches a and c share a weight",
    "checkpoint_nonreentrant": "each branch applied twice under non-reentrant activation checkpointing",
    "checkpoint_reentrant": "each branch applied twice under reentrant activation checkpointing "
                            "(its gradient hook fires twice per backward)",
}
#: Corners a runtime whose every distinct graph is compiled (XLA: PJRT, XRT) cannot train,
#: with the measured reason (docs/scenarios.md, PJRT): never drawn there; a replayed one is
#: ``unsupported``.
XLA_UNSUPPORTED = {
    ("dtype", "bfloat16"): "the PJRT CPU device's collectives have no bfloat16 (xm.all_reduce: "
                           "\"AllReduce for datatype 'bf16' is not supported\")",
    ("grad", "sparse"): "torch_xla has no sparse tensors (Embedding(sparse=True)'s backward raises)",
    ("grad", "sparse_bag"): "torch_xla has no sparse tensors (EmbeddingBag(sparse=True)'s backward raises)",
    ("graph", "checkpoint_nonreentrant"): "torch 2.9's non-reentrant checkpoint has no XLA device module "
                                          "and torch_xla's checkpoint is reentrant only",
}
#: Loop values a runtime whose graphs are compiled (XLA) cannot run, with the measured reason: never
#: drawn there; a replayed one is ``unsupported``.
XLA_UNSUPPORTED_LOOP = {
    ("eval", "inference_mode"): "torch_xla 2.9 cannot run a module under torch.inference_mode() (measured on "
                                "the PJRT CPU device: \"Cannot set version_counter for inference tensor\" in "
                                "the first Linear; also reported on TPU: cambrian-mllm/cambrian#76)",
}
#: Combinations valid for DDP's semantics (the oracle and the reference DDP take them; a replay
#: runs them) that the draw leaves out because torch's own DDP fails them (docs/findings.md 11,
#: reproducer docs/findings/static_graph_no_sync.py).
UPSTREAM_DEFECTS = {
    ("static_graph", "no_sync"): "torch's DDP with static_graph=True raises 'expect_autograd_hooks_ INTERNAL "
                                 "ASSERT FAILED' at the first backward under no_sync() (torch 2.13; "
                                 "pytorch/pytorch#143580, fix in review: #187732)",
}
#: Workload dtypes drawn with short runs only (1..8 steps).
SHORT_RUN_DTYPES = ("bfloat16",)
#: Optimizers that take sparse gradients (torch's Adam/AdamW raise on them: SparseAdam is another
#: optimizer).
SPARSE_OPTIMIZERS = ("sgd", "sgd_momentum")
#: Vocabulary of the sparse corner's embedding; each sample looks up ``INDICES_PER_SAMPLE`` rows.
VOCAB, INDICES_PER_SAMPLE = 16, 2


def workload_corners(workload: dict) -> list[str]:
    """The non-plain values of ``workload``, in :data:`WORKLOADS` order."""
    return [workload[k] for k in WORKLOADS if workload.get(k, PLAIN_WORKLOAD[k]) != PLAIN_WORKLOAD[k]]


def xla_unsupported(workload: dict) -> str | None:
    """Why an XLA runtime cannot train ``workload``, or None."""
    reasons = [XLA_UNSUPPORTED[(k, v)] for k, v in workload.items() if (k, v) in XLA_UNSUPPORTED]
    return "; ".join(reasons) or None


class ScenarioError(ValueError):
    """A scenario that does not parse or names an unknown dimension; one line."""


@dataclass
class Scenario:
    """One scenario (see the module docstring).

    Attributes:
        seed: model and data seed.
        lr: learning rate.
        optimizer: one of :data:`OPTIMIZERS`.
        ddp: DDP keywords (subset of :data:`DDP_KEYS`; ``comm_hook``: ``"allreduce"``).
        rebind_buffers: the model assigns new tensors to its buffers in forward.
        loss_scale_log2: the loss is multiplied by ``2**loss_scale_log2`` before backward and the
            synced gradient divided by it before the step (exact: a power of two).
        checkpoint_at: after this step (0-based) save and reload DDP + optimizer state (or None).
        steps: ``[{"micro": [{"batch": [n_0, ..., n_{W-1}], "plan": [[branch, ...] per replica]}]}]``.
        workload: ``{dimension: value}`` of :data:`WORKLOADS` (a file without it: the plain one).
        loop: ``{dimension: value}`` of :data:`LOOPS` plus ``lr_drop_at`` (a file without it: the
            plain loop, :data:`PLAIN_LOOP`). A step may hold ``"eval"`` (forwards without
            backward, :data:`EVAL_KEYS`) and a micro-step ``"sync"`` (:data:`MICRO_OPTIONAL`).
    """

    seed: int
    lr: float
    optimizer: str
    ddp: dict
    rebind_buffers: bool
    loss_scale_log2: int
    checkpoint_at: int | None
    steps: list = field(default_factory=list)
    workload: dict = field(default_factory=lambda: dict(PLAIN_WORKLOAD))
    loop: dict = field(default_factory=lambda: dict(PLAIN_LOOP))
    module: dict = field(default_factory=lambda: dict(PLAIN_MODULE))

    @property
    def world_size(self) -> int:
        return len(self.steps[0]["micro"][0]["batch"])

    def to_json(self) -> dict:
        """The scenario as JSON data; a plain loop is left out (files stay as before the loop axis)."""
        d = asdict(self)
        if self.loop == PLAIN_LOOP:
            del d["loop"]
        if self.module == PLAIN_MODULE:
            del d["module"]
        return d

    def synced(self, s: int, j: int) -> bool:
        """Whether micro-step ``j`` of step ``s`` (0-based) runs a synced backward."""
        micro = self.steps[s]["micro"]
        return micro[j].get("sync", j == len(micro) - 1)

    def evals(self, s: int, at: int) -> list:
        """``[(e, forward)]``: the forwards without backward of step ``s`` run before micro-step
        ``at``, with their index ``e`` in the step."""
        return [(e, f) for e, f in enumerate(self.steps[s].get("eval", ())) if f["at"] == at]

    def lr_at(self, s: int) -> float:
        """The learning rate of step ``s`` (0-based)."""
        drop = self.loop["lr_drop_at"]
        return self.lr * (LR_DROP if drop is not None and s >= drop else 1.0)

    @classmethod
    def from_json(cls, d) -> "Scenario":
        """Parse and validate.

        Raises:
            ScenarioError: not an object, an unknown or missing key (dimension), or a bad value.
        """
        if not isinstance(d, dict):
            raise ScenarioError("a scenario is a JSON object")
        if "scenario" in d and isinstance(d["scenario"], dict):  # a failure file wraps it
            d = d["scenario"]
        unknown = sorted(set(d) - SCENARIO_KEYS)
        if unknown:
            raise ScenarioError(f"unknown scenario dimension(s) {unknown}; known: {sorted(SCENARIO_KEYS)}")
        missing = sorted(SCENARIO_KEYS - OPTIONAL_KEYS - set(d))
        if missing:
            raise ScenarioError(f"missing scenario key(s) {missing}")
        s = cls(**d)
        s.validate()
        return s

    def validate(self) -> None:
        """Raises ScenarioError naming the first bad value."""
        if self.optimizer not in ALL_OPTIMIZERS:
            raise ScenarioError(f"optimizer {self.optimizer!r}: one of {ALL_OPTIMIZERS}")
        if not isinstance(self.ddp, dict) or set(self.ddp) - DDP_KEYS:
            raise ScenarioError(f"unknown DDP keyword(s) {sorted(set(self.ddp) - DDP_KEYS)}; known: {sorted(DDP_KEYS)}")
        if self.ddp.get("comm_hook") not in (None, "allreduce"):
            raise ScenarioError(f"comm_hook {self.ddp['comm_hook']!r}: only 'allreduce'")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ScenarioError(f"lr {self.lr!r}: a positive number")
        if not self.steps or not isinstance(self.steps, list):
            raise ScenarioError("steps: a non-empty list")
        w = None
        for i, step in enumerate(self.steps):
            if (not isinstance(step, dict) or not STEP_KEYS <= set(step) <= STEP_KEYS | STEP_OPTIONAL
                    or not step["micro"]):
                raise ScenarioError(f"step {i + 1}: an object with a non-empty 'micro' list "
                                    f"(and optionally {sorted(STEP_OPTIONAL)})")
            for j, m in enumerate(step["micro"]):
                if not isinstance(m, dict) or not MICRO_KEYS <= set(m) <= MICRO_KEYS | MICRO_OPTIONAL:
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: keys {sorted(MICRO_KEYS)} "
                                        f"(and optionally {sorted(MICRO_OPTIONAL)})")
                if "sync" in m and (not isinstance(m["sync"], bool)
                                    or (j == len(step["micro"]) - 1 and not m["sync"])):
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: sync is true or false, and "
                                        "true at the window's last micro-step (the step needs synced gradients)")
                w = w or len(m["batch"])
                if len(m["batch"]) != w or len(m["plan"]) != w or w < 1:
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: batch and plan need one entry per replica")
                if any(not isinstance(n, int) or n < 1 for n in m["batch"]):
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: local batch sizes are integers >= 1")
                for p in m["plan"]:
                    if any(b not in BRANCHES for b in p) or len(set(p)) != len(p):
                        raise ScenarioError(f"step {i + 1} micro-step {j + 1}: plan {p}: "
                                            f"distinct branches of {BRANCHES}")
        if self.checkpoint_at is not None and not 0 <= self.checkpoint_at < len(self.steps) - 1:
            raise ScenarioError(f"checkpoint_at {self.checkpoint_at}: a step before the last")
        self._validate_workload()
        self._validate_loop(w)

    def _validate_loop(self, w: int) -> None:
        """The loop's values and every step's forwards without backward."""
        md = self.module
        if not isinstance(md, dict) or set(md) != set(MODULES):
            raise ScenarioError(f"module: an object with keys {sorted(MODULES)}")
        for k, vals in MODULES.items():
            if md[k] not in vals:
                raise ScenarioError(f"module {k} {md[k]!r}: one of {vals}")
        lp = self.loop
        if not isinstance(lp, dict) or set(lp) != set(PLAIN_LOOP):
            raise ScenarioError(f"loop: an object with keys {sorted(PLAIN_LOOP)}")
        for k, vals in LOOPS.items():
            if lp[k] not in vals:
                raise ScenarioError(f"loop {k} {lp[k]!r}: one of {vals}")
        drop = lp["lr_drop_at"]
        if drop is not None and not (isinstance(drop, int) and 0 < drop < len(self.steps)):
            raise ScenarioError(f"loop lr_drop_at {drop!r}: null or a step after the first (0-based)")
        for i, step in enumerate(self.steps):
            evals = step.get("eval", [])
            if not isinstance(evals, list):
                raise ScenarioError(f"step {i + 1}: eval is a list")
            for e, f in enumerate(evals):
                where = f"step {i + 1} eval forward {e + 1}"
                if not isinstance(f, dict) or set(f) != EVAL_KEYS:
                    raise ScenarioError(f"{where}: keys {sorted(EVAL_KEYS)}")
                if not (isinstance(f["at"], int) and 0 <= f["at"] <= len(step["micro"])):
                    raise ScenarioError(f"{where}: at {f['at']!r}: a micro-step index 0..{len(step['micro'])}")
                if f["grad"] not in EVAL_GRAD or f["mode"] not in EVAL_MODE:
                    raise ScenarioError(f"{where}: grad one of {EVAL_GRAD}, mode one of {EVAL_MODE}")
                if len(f["batch"]) != w or any(not isinstance(n, int) or n < 1 for n in f["batch"]):
                    raise ScenarioError(f"{where}: batch: one local batch size >= 1 per replica")
                if f["grad"] == "inference_mode" and f["mode"] == "train" and self.rebind_buffers:
                    raise ScenarioError(f"{where}: an inference_mode forward in train mode with buffers "
                                        "rebound in forward makes the buffers inference tensors, which "
                                        "DDP's in-place buffer broadcast may not update (torch raises)")

    def _validate_workload(self) -> None:
        """The workload's values, and the combinations upstream DDP forbids or that mean nothing."""
        wl = self.workload
        if not isinstance(wl, dict) or set(wl) != set(WORKLOADS):
            raise ScenarioError(f"workload: an object with keys {sorted(WORKLOADS)}")
        for k, v in wl.items():
            if v not in WORKLOADS[k]:
                raise ScenarioError(f"workload {k} {v!r}: one of {WORKLOADS[k]}")
        if wl["grad"] != "dense" and self.optimizer not in SPARSE_OPTIMIZERS:
            raise ScenarioError(f"workload grad {wl['grad']!r} with optimizer {self.optimizer!r}: sparse "
                                f"gradients need one of {SPARSE_OPTIMIZERS} (torch's Adam/AdamW refuse them)")
        static = bool(self.ddp.get("static_graph"))
        if wl["graph"] == "checkpoint_reentrant" and not static:
            raise ScenarioError("workload graph 'checkpoint_reentrant' needs DDP static_graph=True (upstream "
                                "raises 'Expected to mark a variable ready only once' without it)")
        if static:  # one graph for the whole run: the same plan everywhere
            plans = {tuple(p) for st in self.steps for m in st["micro"] for p in m["plan"]}
            if len(plans) != 1:
                raise ScenarioError("static_graph=True: every replica and micro-step runs the same plan")
            if not self.ddp.get("find_unused_parameters") and len(next(iter(plans))) != len(BRANCHES):
                raise ScenarioError("static_graph=True without find_unused_parameters: the plan uses every branch")

    def describe_step(self, s: int, config: bool = True) -> str:
        """The scenario dimensions in play at step ``s`` (0-based), for verdict reasons;
        ``config``: with the optimizer and DDP keywords (the same at every step)."""
        step = self.steps[s]["micro"]
        parts = []
        k = len(step)
        if k > 1:
            parts.append(f"accumulation window of {k} micro-steps (no_sync)")
        batches = [m["batch"] for m in step]
        if any(len(set(b)) > 1 for b in batches):
            parts.append(f"uneven local batches {batches if k > 1 else batches[0]}")
        plans = [m["plan"] for m in step]
        if any(len({tuple(p) for p in pl}) > 1 for pl in plans):
            parts.append("rank-dependent branches/hook order")
        used_last = set().union(*[set(p) for p in plans[-1]])
        used_any = set().union(*[set(p) for pl in plans for p in pl])
        if used_any - used_last:
            parts.append(f"branch(es) {sorted(used_any - used_last)} used only in no_sync micro-steps")
        per_replica = [set().union(*[set(pl[r]) for pl in plans]) for r in range(len(plans[0]))]
        partly = sorted(set().union(*per_replica) - set.intersection(*per_replica))
        if partly:
            parts.append(f"branch(es) {partly} used by some replicas only")
        if set(BRANCHES) - used_any:
            parts.append(f"globally unused branch(es) {sorted(set(BRANCHES) - used_any)}")
        if self.rebind_buffers:
            parts.append("buffers rebound in forward")
        if self.loss_scale_log2:
            parts.append(f"loss scale 2**{self.loss_scale_log2}")
        if self.checkpoint_at is not None and s > self.checkpoint_at:
            parts.append(f"after the checkpoint reload at step {self.checkpoint_at + 1}")
        parts += self.describe_loop(s)
        on = [k for k, v in self.ddp.items() if v not in (None, False)]
        if config:
            parts.append(f"optimizer {self.optimizer}" + (f", DDP {', '.join(on)}" if on else ""))
        workload = self.describe_workload()
        return "; ".join(parts + [workload] if workload else parts)

    def describe_loop(self, s: int) -> list[str]:
        """The loop program's dimensions in play at step ``s`` (0-based), as verdict phrases."""
        micro = self.steps[s]["micro"]
        parts = []
        synced = [j for j in range(len(micro)) if self.synced(s, j)]
        if len(synced) > 1:
            parts.append(f"{len(synced)} synced backwards in one step (their averaged gradients sum)")
        for e, f in enumerate(self.steps[s].get("eval", ())):
            where = ("after the last backward, before the step" if f["at"] == len(micro)
                     else f"before micro-step {f['at'] + 1}")
            parts.append(f"a forward without backward under {f['grad']} in {f['mode']} mode {where}")
        parts += [MODULE_PHRASES[v] for k, v in self.module.items() if v != PLAIN_MODULE[k]]
        lp = self.loop
        if lp["zero_grad"] == "zeros":
            parts.append("zero_grad(set_to_none=False): zero gradients, not None")
        if lp["module_mode"] == "eval":
            parts.append("training forwards and backwards in eval mode")
        if lp["clip"] == "norm":
            parts.append(f"clip_grad_norm_(max_norm={CLIP_NORM}) on the synced gradients")
        if lp["lr_drop_at"] is not None and s >= lp["lr_drop_at"]:
            parts.append(f"learning rate x {LR_DROP} from step {lp['lr_drop_at'] + 1}")
        return parts

    def describe_workload(self) -> str:
        """``workload: <corner>, <corner>`` (``""`` for the plain workload)."""
        corners = workload_corners(self.workload)
        return "workload: " + ", ".join(WORKLOAD_PHRASES[c] for c in corners) if corners else ""


def load_scenario(path: str) -> Scenario:
    """Read a scenario (or a failure file holding one) from a JSON file.

    Raises:
        ScenarioError: unreadable, not JSON, or invalid (one line).
    """
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as exc:
        raise ScenarioError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        return Scenario.from_json(d)
    except TypeError as exc:
        raise ScenarioError(f"{path}: {exc}") from None


# --------------------------------------------------------------------------
# the model and the data (built identically in replicas and in the oracle)
# --------------------------------------------------------------------------

def build_scenario_model(seed: int, rebind: bool, buffer_offset: float = 0.0, workload: dict | None = None,
                         module: dict | None = None):
    """``stem -> h; h + sum over the plan's branches (in plan order) of tanh(branch(h)) -> head``.

    Parameters U(-1/sqrt(fan_in), 1/sqrt(fan_in)) from ``seed`` (fan_in of a conv or
    embedding weight: its first row's size; complex: real and imaginary parts so drawn);
    buffers ``ema`` (``[HIDDEN]``: moving average of the stem's batch mean, 0.9/0.1) and
    ``count`` (int64 scalar: training forwards), updated in training forward by
    assignment of new tensors when ``rebind`` else in place. Buffers never feed the
    output. ``buffer_offset`` is added to ``ema`` (rank-dependent starts). ``workload``
    (:data:`WORKLOADS`; default plain) changes the parameters' dtype, layout, gradient
    kind and the graph; inputs ``x`` float32 ``[n, IN_FEATURES]`` and, for a sparse
    workload, ``idx`` int64 ``[n, INDICES_PER_SAMPLE]``; output ``[n, OUT_FEATURES]``
    (float64 for the float64 workload, else float32). ``module`` (:data:`MODULES`; default plain):
    the output's structure, ``ema``'s persistence, a forward pre-hook.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    wl = dict(PLAIN_WORKLOAD, **(workload or {}))
    md = dict(PLAIN_MODULE, **(module or {}))

    class LowPrecisionLinear(nn.Linear):
        """A Linear in a lower dtype (bfloat16) between float layers: input cast down, output back."""

        def forward(self, h):
            return super().forward(h.to(self.weight.dtype)).to(h.dtype)

    class ComplexLinear(nn.Module):
        """A complex64 weight [out, in] and bias; a real output ``Re z + Im z / 2`` (only the
        matmul is complex: torch_xla's complex tanh backward differs from CPU's)."""

        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=torch.complex64))
            self.bias = nn.Parameter(torch.zeros(n_out, dtype=torch.complex64))

        def forward(self, h):
            z = F.linear(h.to(self.weight.dtype), self.weight, self.bias)
            return (z.real + 0.5 * z.imag).to(h.dtype)

    class ConvStem(nn.Module):
        """The stem as a 2x2 conv over ``x`` seen as ``[n, 2, 2, 2]`` (the same map as a Linear),
        its weight ``[HIDDEN, 2, 2, 2]`` in ``channels_last`` memory format."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, HIDDEN, 2).to(memory_format=torch.channels_last)

        def forward(self, x):
            return self.conv(x.reshape(-1, 2, 2, 2).contiguous(memory_format=torch.channels_last)).flatten(1)

    def branch(b):
        if b == "b" and wl["dtype"] == "complex64":
            return ComplexLinear(HIDDEN, HIDDEN)
        if b == "b" and wl["dtype"] == "bfloat16":
            return LowPrecisionLinear(HIDDEN, HIDDEN, dtype=torch.bfloat16)
        return nn.Linear(HIDDEN, HIDDEN)

    class ScenarioNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = ConvStem() if wl["layout"] == "channels_last" else nn.Linear(IN_FEATURES, HIDDEN)
            self.branch = nn.ModuleDict({b: branch(b) for b in BRANCHES})
            self.head = nn.Linear(HIDDEN, OUT_FEATURES)
            if wl["layout"] == "transposed":  # [OUT, HIDDEN] with strides (1, OUT)
                self.head.weight = nn.Parameter(torch.zeros(HIDDEN, OUT_FEATURES).t())
            if wl["graph"] == "shared":
                self.branch["c"].weight = self.branch["a"].weight
            if wl["grad"] == "sparse":
                self.emb = nn.Embedding(VOCAB, HIDDEN, sparse=True)
            elif wl["grad"] == "sparse_bag":
                self.emb = nn.EmbeddingBag(VOCAB, HIDDEN, mode="mean", sparse=True)
            self.register_buffer("ema", torch.zeros(HIDDEN), persistent=md["buffers"] == "persistent")
            self.register_buffer("count", torch.zeros((), dtype=torch.int64))
            self.rebind = rebind
            self.calls = 0

        def _branch(self, b, h):
            graph = wl["graph"]
            if graph in ("plain", "shared"):
                return h + torch.tanh(self.branch[b](h))
            # Applied twice: each application adds half, so the model is no deeper in effect
            # than the plain one (measured: at full weight an SGD lr-0.2 run grew its steps
            # 0.2 -> 16 in 5 steps and float32 rounding noise to 5.7e-5, torch and ref alike).
            fn = (lambda t: 0.5 * torch.tanh(self.branch[b](t)))
            for _ in range(2):  # applied twice; each under its own checkpoint if so drawn
                if graph == "applied_twice":
                    h = h + fn(h)
                    continue
                reentrant = graph == "checkpoint_reentrant"
                ckpt = checkpoint
                if h.device.type == "xla":  # torch.utils.checkpoint looks up torch.xla (torch 2.9)
                    from torch_xla.utils.checkpoint import checkpoint as ckpt  # reentrant only
                h = h + ckpt(fn, h, use_reentrant=reentrant)
            return h

        def forward(self, x, plan=BRANCHES, idx=None):
            x = x.to(self.head.weight.dtype)
            pre = self.stem(x)
            if idx is not None:
                e = self.emb(idx)
                pre = pre + (e.mean(1) if e.dim() == 3 else e)
            h = torch.tanh(pre)
            if self.training:
                with torch.no_grad():
                    new = 0.9 * self.ema + 0.1 * h.detach().mean(0)
                    if self.rebind:  # a new object each forward: a cached buffer list goes stale
                        self.ema = new
                        self.count = self.count + 1
                    else:
                        self.ema.copy_(new)
                        self.count.add_(1)
            for b in plan:
                h = self._branch(b, h)
            out = self.head(h)
            if md["output"] == "dict":
                return {"pred": out, "hidden": h.detach(), "note": "scenario"}
            if md["output"] == "dataclass":
                self.calls += 1  # a host int (reading ``count`` would run the graph on XLA)
                return ScenarioOutput(pred=out, hidden=h.detach(), calls=self.calls)
            return out

    net = ScenarioNet()
    if md["hook"] == "pre_hook":
        net.register_forward_pre_hook(lambda mod, args: (args[0] * 0.5,) + tuple(args[1:]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in net.modules():
            if isinstance(mod, nn.Linear):
                bound = 1.0 / math.sqrt(mod.in_features)
                mod.weight.uniform_(-bound, bound, generator=gen)
                mod.bias.uniform_(-bound, bound, generator=gen)
            elif isinstance(mod, (nn.Conv2d, nn.Embedding, nn.EmbeddingBag, ComplexLinear)):
                for p in mod.parameters(recurse=False):  # in place: dtype and strides kept
                    real = torch.view_as_real(p) if p.is_complex() else p
                    bound = 1.0 / math.sqrt(p[0].numel() if p.dim() > 1 else p.numel())
                    real.copy_(torch.empty(real.shape, dtype=torch.float64).uniform_(-bound, bound, generator=gen))
        if wl["dtype"] == "float64":
            net.double()  # parameters and ema; strides kept
        net.ema.add_(buffer_offset)
    return net


def scenario_batch(seed: int, step: int, micro: int, rank: int, n: int):
    """``(x [n, IN_FEATURES], y [n, OUT_FEATURES])`` float32 N(0, 1), from (seed, step, micro, rank)."""
    import torch
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 101 + micro) * 257 + rank)
    return torch.randn(n, IN_FEATURES, generator=gen), torch.randn(n, OUT_FEATURES, generator=gen)


def scenario_indices(seed: int, step: int, micro: int, rank: int, n: int):
    """``idx`` int64 ``[n, INDICES_PER_SAMPLE]`` in ``[0, VOCAB)`` (the sparse corner's embedding
    lookups), from (seed, step, micro, rank) apart from :func:`scenario_batch`'s draw."""
    import torch
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 101 + micro) * 257 + rank + 7)
    return torch.randint(0, VOCAB, (n, INDICES_PER_SAMPLE), generator=gen)


# --------------------------------------------------------------------------
# the replica task
# --------------------------------------------------------------------------

def scenario_task(ctx, *, impl: str, scenario: dict) -> dict:
    """World task: run ``scenario`` on this replica with implementation ``impl``.

    Returns ``params`` float32 ``[S+1, P]``, ``buffers`` float64 ``[S+1, B]`` (after
    construction and after each optimizer step), ``optim_digests`` (SHA-1 per step),
    ``optim`` (final optimizer state, float64), ``layout`` (the tensors' names and
    shapes, as ``harness.train_replica`` gives them).

    Raises:
        Unsupported: the implementation refuses a keyword or lacks no_sync /
            register_comm_hook.
    """

    import torch

    sc = Scenario.from_json(scenario)
    row = resolve_impl(impl)
    if row.forward_backward is not None or row.make_optimizer is not None:
        raise Unsupported(f"{impl} brings its own {'compiled step' if row.forward_backward else 'optimizer'}, "
                          "which the scenario loop (its own optimizers, micro-steps) would bypass")
    r = ctx.rank
    # Only keywords that change something are passed (a recipe without them stays usable).
    kwargs = {"broadcast_buffers": sc.ddp.get("broadcast_buffers", True)}
    kwargs.update({k: v for k, v in sc.ddp.items() if k not in ("comm_hook", "broadcast_buffers")
                   and v not in (None, False)})
    # every replica runs every branch at every micro-step: find_unused_parameters changes
    # nothing (torch's DDP reduces the same gradients), so a DDP refusing it still runs
    every_branch = all(set(p) == set(BRANCHES) for s in sc.steps for m in s["micro"] for p in m["plan"])
    optional = ("find_unused_parameters",) if every_branch else ()
    requires = [k for k in kwargs if k != "broadcast_buffers" and k not in optional]
    if any(not sc.synced(s, j) for s in range(len(sc.steps)) for j in range(len(sc.steps[s]["micro"]))):
        requires.append("no_sync")
    if sc.ddp.get("comm_hook"):
        requires.append("register_comm_hook")

    why = xla_unsupported(sc.workload) if str(ctx.device).startswith("xla") else None
    if why:
        raise Unsupported(f"workload {workload_corners(sc.workload)}: {why}")
    if str(ctx.device).startswith("xla") and any(f["grad"] == "inference_mode" for st in sc.steps
                                                 for f in st.get("eval", ())):
        raise Unsupported(XLA_UNSUPPORTED_LOOP[("eval", "inference_mode")])
    sparse = sc.workload["grad"] != "dense"

    def build(salt=0):  # replica r from its own seed and ema offset: only a DDP that broadcasts matches
        m = to_device(build_scenario_model(rank_seed(sc.seed, r, salt), sc.rebind_buffers,
                                           rank_buffer_offset(r, salt), sc.workload, sc.module), ctx.device)
        ddp = wrap(row, m, ctx, kwargs, tuple(requires), optional)
        if sc.ddp.get("comm_hook"):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            register_hook(ddp, row.name, default_hooks.allreduce_hook)
        ctx.mark_step()
        return m, ddp, build_optimizer(sc.optimizer, ddp.parameters(), sc.lr)

    try:
        model, ddp, opt = build()
    except NotImplementedError as exc:  # a library's refusal of a corner at construction (same on every replica)
        if not workload_corners(sc.workload):
            raise
        raise Unsupported(f"{impl} refuses workload {workload_corners(sc.workload)}: "
                          f"NotImplementedError: {exc}") from None
    which = row.shard_rank(ctx)
    scale = 2.0 ** sc.loss_scale_log2
    lp = sc.loop
    training = lp["module_mode"] == "train"

    def evaluate(s, at):  # forwards without backward (the loop programs), output discarded
        for e, f in sc.evals(s, at):
            x, _ = scenario_batch(sc.seed, s, EVAL_DATA + e, which, f["batch"][which])
            extra = ({"idx": scenario_indices(sc.seed, s, EVAL_DATA + e, which, f["batch"][which]).to(ctx.device)}
                     if sparse else {})
            set_mode(f["mode"] == "train")
            with torch.no_grad() if f["grad"] == "no_grad" else torch.inference_mode():
                ddp(x.to(ctx.device), **extra)
            set_mode(training)
            ctx.mark_step()

    def set_mode(train):  # as a user does: on the wrapper (which sets the module's mode)
        (ddp if callable(getattr(ddp, "train", None)) else model).train(train)

    if not training:
        set_mode(False)
    params, buffers, digests = [flat_params(model)], [flat_buffers(model)], []
    for s, step in enumerate(sc.steps):
        opt.zero_grad(set_to_none=lp["zero_grad"] == "set_to_none")
        for group in opt.param_groups:
            group["lr"] = sc.lr_at(s)
        micro = step["micro"]
        for j, m in enumerate(micro):
            evaluate(s, j)
            x, y = scenario_batch(sc.seed, s, j, which, m["batch"][which])
            plan = tuple(m["plan"][which])
            extra = {"idx": scenario_indices(sc.seed, s, j, which, m["batch"][which]).to(ctx.device)} if sparse else {}
            ctxm = contextlib.nullcontext() if sc.synced(s, j) else ddp.no_sync()
            with ctxm:
                out = ddp(x.to(ctx.device), plan=plan, **extra)
                (mse(prediction_of(out), y.to(ctx.device)) * scale).backward()
            if j < len(micro) - 1:
                ctx.mark_step()
        evaluate(s, len(micro))
        if row.after_backward is not None:
            row.after_backward(ddp, opt, ctx)
        if scale != 1.0:
            with torch.no_grad():
                for q in model.parameters():
                    if q.grad is not None:
                        q.grad.div_(scale)
        if lp["clip"] == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        if row.optimizer_step is not None:  # the strategy's step replaces optimizer.step()
            row.optimizer_step(ddp, opt, ctx)
        else:
            opt.step()
        ctx.mark_step()
        params.append(flat_params(model))
        buffers.append(flat_buffers(model))
        digests.append(state_digest(flat_optimizer_state(opt)))
        if sc.checkpoint_at == s:
            model_state, optim_state = saved_checkpoint(ddp.state_dict(), opt.state_dict())
            model, ddp, opt = build(salt=1)
            model.load_state_dict(model_state)
            opt.load_state_dict(optim_state)
            if not training:
                set_mode(False)
    layout = {"params": param_layout(model), "buffers": buffer_layout(model),
              "optim": optimizer_state_layout(opt, None, model)}
    return {"params": np.stack(params), "buffers": np.stack(buffers), "optim_digests": digests,
            "optim": flat_optimizer_state(opt), "layout": layout}


# --------------------------------------------------------------------------
# the oracle
# --------------------------------------------------------------------------

def scenario_reference(sc: Scenario) -> dict:
    """DDP's semantics for ``sc`` on one CPU device, each parameter in its own dtype (the
    workload's; the loss float64 for a float64 model); a sparse gradient's replica mean is
    dense (the same SGD update as upstream's sparse all-reduce).

    Each replica's gradients are kept apart; its backwards accumulate into them (autograd's
    ``AccumulateGrad``). A synced backward (the last of an accumulation window, or any with
    ``"sync": true``) replaces every replica's gradient by the replicas' mean (zeros where a
    replica holds ``None``), except a parameter no replica's backward reached since the last
    synced one with ``find_unused_parameters``: torch's reducer leaves its gradient as it is
    (``None``, a zero tensor after ``zero_grad(set_to_none=False)``, or an earlier synced
    backward's mean). Buffers: a forward through the DDP starts from rank 0's buffers when
    ``broadcast_buffers`` and the previous forward was a synced one with grad enabled, or there
    was none since construction (``torch.nn.parallel.DistributedDataParallel._pre_forward`` /
    ``_post_forward``: ``require_forward_param_sync``, whatever the module's mode).

    Returns ``params`` ``[S+1, P]``, ``buffers`` ``[S+1, W, B]`` (what each replica
    must hold after each step), ``optim`` (final optimizer state).
    """
    import torch

    w = sc.world_size
    net = build_scenario_model(sc.seed, sc.rebind_buffers, workload=sc.workload, module=sc.module)
    sparse = sc.workload["grad"] != "dense"
    lp = sc.loop
    training = lp["module_mode"] == "train"
    opt = build_optimizer(sc.optimizer, net.parameters(), sc.lr)
    scale = 2.0 ** sc.loss_scale_log2
    params = list(net.parameters())
    find_unused = bool(sc.ddp.get("find_unused_parameters"))
    bcast = sc.ddp.get("broadcast_buffers", True)
    # Construction broadcasts buffers only with broadcast_buffers (as upstream).
    rank_bufs = [[t.detach().clone() + (0 if bcast or not t.is_floating_point() else rank_buffer_offset(r))
                  for t in net.buffers()] for r in range(w)]
    names = [n for n, _ in net.named_buffers()]
    grads = [[None] * len(params) for _ in range(w)]  # each replica's .grad
    reached = [False] * len(params)  # some replica's backward reached it since the last synced one
    for i, q in enumerate(params):
        q.register_post_accumulate_grad_hook(lambda _, i=i: reached.__setitem__(i, True))

    def set_bufs(vals):
        for n, v in zip(names, vals):
            setattr(net, n, v.clone())

    def get_bufs():
        return [t.detach().clone() for t in net.buffers()]

    def flat_bufs():
        return np.stack([np.concatenate([t.double().reshape(-1).numpy() for t in rb]) for rb in rank_bufs])

    state = {"sync_next": True}  # require_forward_param_sync: construction counts as a synced forward

    def forward(r, s, j, n, plan, mode):
        """Replica ``r``'s forward on micro-batch ``(s, j)`` through the DDP's buffer semantics."""
        x, y = scenario_batch(sc.seed, s, j, r, n)
        extra = {"idx": scenario_indices(sc.seed, s, j, r, n)} if sparse else {}
        set_bufs(rank_bufs[r])
        net.train(mode)
        out = net(x, plan=plan, **extra)
        rank_bufs[r] = get_bufs()
        return out, y

    def begin_forwards():
        if bcast and state["sync_next"]:
            for r in range(1, w):
                rank_bufs[r] = [t.clone() for t in rank_bufs[0]]

    out_p = [flat_params(net)]
    out_b = [flat_bufs()]
    for s, step in enumerate(sc.steps):
        micro = step["micro"]
        for r in range(w):  # optimizer.zero_grad
            grads[r] = [None if g is None or lp["zero_grad"] == "set_to_none" else torch.zeros_like(g)
                        for g in grads[r]]
        for g in opt.param_groups:
            g["lr"] = sc.lr_at(s)

        def evaluate(at):
            for e, f in sc.evals(s, at):
                begin_forwards()
                for r in range(w):
                    with torch.no_grad():
                        forward(r, s, EVAL_DATA + e, f["batch"][r], BRANCHES, f["mode"] == "train")
                state["sync_next"] = False
        for j, m in enumerate(micro):
            evaluate(j)
            synced = sc.synced(s, j)
            begin_forwards()
            for r in range(w):
                out, y = forward(r, s, j, m["batch"][r], tuple(m["plan"][r]), training)
                for i, q in enumerate(params):  # a copy: AccumulateGrad may add in place
                    q.grad = None if grads[r][i] is None else grads[r][i].clone()
                (mse(prediction_of(out), y) * scale).backward()
                # a sparse gradient's replica mean is taken dense
                grads[r] = [None if q.grad is None else q.grad.to_dense() if q.grad.is_sparse else q.grad
                            for q in params]
            state["sync_next"] = synced
            if not synced:
                continue
            for i in range(len(params)):
                if find_unused and not reached[i]:
                    continue  # no replica reached it since the last synced backward: untouched
                total = None
                for r in range(w):  # the replicas' gradients, zeros where None, in rank order
                    g = grads[r][i] if grads[r][i] is not None else torch.zeros_like(params[i])
                    total = g.clone() if total is None else total + g
                for r in range(w):
                    grads[r][i] = total / w
            reached[:] = [False] * len(params)
        evaluate(len(micro))
        with torch.no_grad():
            for i, q in enumerate(params):
                q.grad = None if grads[0][i] is None else grads[0][i] / scale
        if lp["clip"] == "norm":
            torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        opt.step()
        for r in range(w):  # the step's gradients, unscaled (and clipped), as on every replica
            grads[r] = [None if q.grad is None else q.grad.clone() for q in params]
        out_p.append(flat_params(net))
        out_b.append(flat_bufs())
        if sc.checkpoint_at == s:
            state["sync_next"] = True  # a new DDP: its first forward broadcasts
            grads = [[None] * len(params) for _ in range(w)]  # a state dict holds no gradients
            if sc.module["buffers"] == "non_persistent":  # not in the state dict: the new module's own
                ema = names.index("ema")               # (construction broadcasts rank 0's if bcast)
                for r in range(w):
                    fresh = torch.zeros_like(rank_bufs[r][ema]) + rank_buffer_offset(0 if bcast else r, 1)
                    rank_bufs[r][ema] = fresh
    return {"params": np.stack(out_p), "buffers": np.stack(out_b), "optim": flat_optimizer_state(opt)}


# --------------------------------------------------------------------------
# the judge
# --------------------------------------------------------------------------

def judge_scenario(sc: Scenario, results: list, tol, *, agreement_atol: float = 0.0) -> list[dict]:
    """Compare every replica with the oracle: parameters and buffers after every step,
    final optimizer state, and replica agreement (parameters and optimizer state
    bit-identical to replica 0's after every step). Returns one
    :class:`~conformance.verdict.Verdict` per check of
    :data:`~conformance.cases.checks.SCENARIO_CHECKS` (case and implementation fields left
    for the caller)."""
    ref = scenario_reference(sc)
    out = []
    for name, row in SCENARIO_CHECKS.items():
        if name == AGREEMENT:
            out.append(judge_agreement(results, case="", impl="", runtime="", model="scenario", atol=agreement_atol))
            continue
        v = judge(replace(CHECKS[row], name=name), results, ref, tol, case="", impl="", runtime="", model="scenario")
        if name == "optimizer_state":
            if v.status == "vacuous" and not ref["optim"].size:
                v.status, v.reason = "pass", "the optimizer keeps no state (plain SGD): nothing to compare"
        out.append(v)
    for v in out:  # the dimensions in play at the failing step first (the table shows the first sentence)
        if v.status == "fail" and v.first_bad_step:
            s = min(v.first_bad_step, len(sc.steps)) - 1
            dims = sc.describe_step(s, config=False)
            v.reason = (f"step {s + 1} of {len(sc.steps)}{f' ({dims})' if dims else ''}: {v.reason} "
                        f"The scenario runs optimizer {sc.optimizer}, DDP keywords {sc.ddp}.")
    return out


# --------------------------------------------------------------------------
# generation (Hypothesis) and the case runner
# --------------------------------------------------------------------------

#: Learning rates per optimizer: large enough that one step moves parameters by
#: >= 100 x atol (the vacuity guard), small enough to stay stable for 120 steps.
LRS = {"sgd": (0.05, 0.1, 0.2), "sgd_momentum": (0.02, 0.05), "adam": (0.005, 0.01), "adamw": (0.005, 0.01),
       "sgd_wd": (0.1, 0.2)}


@dataclass(frozen=True)
class Space:
    """What a scenario case draws from (a row's ``args["space"]``)."""

    optimizers: tuple = OPTIMIZERS
    ddp_extra: tuple = ()        # ("buckets",) and/or ("comm_hook",)
    max_steps: int = 120
    budget: float = 1.0          # fraction of the profile's example budget (conformance.cases.search)
    rank_uniform: bool = False   # equal local batches and plans on every replica (XLA runtimes)
    few_shapes: bool = False     # local batches from FEW_BATCHES (each distinct graph a compilation)
    workload: bool = False       # draw the workload (WORKLOADS) too; else the plain one
    xla_corners: bool = False    # draw only the corners XLA runtimes train (not XLA_UNSUPPORTED)
    loop: bool = False           # draw the loop program (LOOPS, forwards without backward, synced
    #                              backwards), and the default optimizers include sgd_wd (ALL_OPTIMIZERS)
    max_pattern: int = 4         # the most distinct steps a run repeats (a loop case: the profile's loop_depth)


#: Local batch sizes of generated scenarios where each distinct graph is compiled (XLA):
#: few, so graphs repeat across examples; 1 and more than 1 as in the full draw (1..6).
FEW_BATCHES = (1, 4)

#: Plans of generated scenarios where each distinct graph is compiled (XLA), first the plain one:
#: registration order and its reverse (hook order), and with ``find_unused_parameters`` a
#: branch left out, two, and all three (unused parameters) - each kind of the full draw, few graphs.
FEW_PLANS = (("a", "b", "c"), ("c", "b", "a"))
FEW_UNUSED_PLANS = (("a", "b"), ("c",), ())

#: ``Space.ddp_extra`` values -> the DDP keywords / methods their scenarios require.
DDP_EXTRAS = {"buckets": ("bucket_cap_mb", "gradient_as_bucket_view"), "comm_hook": ("register_comm_hook",),
              "static_graph": ("static_graph",)}


def space_problem(space: dict) -> str | None:
    """Why ``space`` (a scenario row's ``args["space"]``) is not a :class:`Space` the
    scenarios can be drawn from, or None."""
    known = [f.name for f in fields(Space)]
    unknown = sorted(set(space) - set(known))
    if unknown:
        return f"unknown key(s) {unknown}; known: {known}"
    sp = Space(**space)
    if set(sp.ddp_extra) - set(DDP_EXTRAS):
        return f"unknown ddp_extra {sorted(set(sp.ddp_extra) - set(DDP_EXTRAS))}; known: {sorted(DDP_EXTRAS)}"
    if not sp.optimizers or set(sp.optimizers) - set(ALL_OPTIMIZERS):
        return f"optimizers {sp.optimizers}: a non-empty subset of {ALL_OPTIMIZERS}"
    if not 1 <= sp.max_pattern <= 16:
        return f"max_pattern {sp.max_pattern}: 1..16 distinct steps"
    if sp.max_steps < 41:
        return f"max_steps {sp.max_steps}: at least 41 (long runs are drawn from 41..max_steps)"
    if not sp.budget > 0:
        return f"budget {sp.budget}: a positive fraction of the profile's example budget"
    return None


def space_requires(space: dict) -> tuple:
    """The DDP keywords / methods the scenarios of ``space`` require (an implementation
    ignoring or lacking one is ``unsupported`` for the case)."""
    return tuple(k for extra in Space(**space).ddp_extra for k in DDP_EXTRAS[extra])


def scenarios(world_size: int, space: Space):
    """Hypothesis strategy of :class:`Scenario` for ``world_size`` replicas.

    A run is a pattern of 1..4 distinct optimizer steps repeated cyclically to its
    length (1..8, or one run in ten 41..``max_steps``: faults that start late), so
    long runs stay cheap to draw and shrink. Everything shrinks towards the plain case: one step,
    one micro-step, equal batches of 1, every branch in the same order, SGD.
    """
    from hypothesis import strategies as st

    def plan(find_unused):
        if space.few_shapes:
            return st.sampled_from(FEW_PLANS + (FEW_UNUSED_PLANS if find_unused else ())).map(list)
        perm = st.permutations(BRANCHES)
        if not find_unused:
            return perm.map(list)
        return st.tuples(perm, st.integers(0, len(BRANCHES))).map(lambda t: list(t[0][:t[1]]))

    @st.composite
    def build(draw):
        workload = draw(workloads(space)) if space.workload else dict(PLAIN_WORKLOAD)
        sparse = workload["grad"] != "dense"
        optimizers = ALL_OPTIMIZERS if space.loop and space.optimizers == OPTIMIZERS else space.optimizers
        optimizer = draw(st.sampled_from([o for o in optimizers if not sparse or o in SPARSE_OPTIMIZERS]
                                         or list(optimizers)))
        find_unused = draw(st.booleans())
        ddp = {"find_unused_parameters": find_unused, "broadcast_buffers": not draw(st.booleans())}
        if "buckets" in space.ddp_extra:
            ddp["bucket_cap_mb"] = draw(st.sampled_from([25.0, 0.0005, 0.002]))
            ddp["gradient_as_bucket_view"] = draw(st.booleans())
        if "comm_hook" in space.ddp_extra:
            ddp["comm_hook"] = "allreduce"
        static = False
        if "static_graph" in space.ddp_extra:  # upstream needs it for a reentrant checkpoint
            static = workload["graph"] == "checkpoint_reentrant" or draw(st.booleans())
            ddp["static_graph"] = static
        # static_graph: one graph for the run, so one plan everywhere (all branches unless
        # find_unused_parameters)
        fixed = (draw(plan(find_unused)) if find_unused else draw(st.permutations(BRANCHES).map(list))) \
            if static else None
        pattern = []
        for _ in range(draw(st.integers(1, space.max_pattern))):
            # static_graph with a no_sync window crashes torch's DDP (UPSTREAM_DEFECTS): not drawn
            k = 1 if static else draw(st.integers(1, 3))
            micro = []
            for _ in range(k):
                if space.few_shapes:
                    batch = [draw(st.sampled_from(FEW_BATCHES))] * world_size
                    plans = [draw(plan(find_unused))] * world_size
                elif space.rank_uniform:
                    batch = [draw(st.integers(1, 6))] * world_size
                    plans = [draw(plan(find_unused))] * world_size
                else:
                    batch = [draw(st.integers(1, 6)) for _ in range(world_size)]
                    plans = [draw(plan(find_unused)) for _ in range(world_size)]
                if fixed is not None:
                    plans = [list(fixed) for _ in range(world_size)]
                micro.append({"batch": batch, "plan": plans})
            step = {"micro": micro}
            if space.loop:  # the loop program: synced backwards and forwards without backward
                for m in micro[:-1]:
                    if not static and draw(st.booleans()):
                        m["sync"] = True
                evals = draw(st.lists(eval_forward(len(micro)), max_size=2))
                if evals:
                    step["eval"] = evals
            pattern.append(step)
        # One run in ten is long (faults that start late); the explicit scenarios hold one too.
        # (not with a bfloat16 part: its 1-ulp rounding flips compound over long runs, above any
        # bound a short run's movement clears)
        long_run = draw(st.integers(0, 9)) == 9 and workload["dtype"] not in SHORT_RUN_DTYPES
        n = draw(st.integers(41, space.max_steps) if long_run else st.integers(1, 8))
        steps = [copy.deepcopy(pattern[i % len(pattern)]) for i in range(n)]
        ckpt = draw(st.one_of(st.none(), st.integers(0, max(0, n - 2)))) if n > 1 else None
        sc = Scenario(seed=draw(st.integers(0, 2 ** 20)), lr=draw(st.sampled_from(LRS[optimizer])),
                      optimizer=optimizer, ddp=ddp, rebind_buffers=draw(st.booleans()),
                      loss_scale_log2=draw(st.sampled_from([0, 8, 20])), checkpoint_at=ckpt, steps=steps,
                      workload=workload)
        if space.loop:
            sc.module = {k: draw(st.sampled_from(v)) for k, v in MODULES.items()}
            sc.loop = dict({k: draw(st.sampled_from(v)) for k, v in LOOPS.items()},
                           lr_drop_at=draw(st.one_of(st.none(), st.integers(1, n - 1))) if n > 1 else None)
            if sc.rebind_buffers:  # rebound buffers cannot be made under inference_mode (validate says why)
                for step in sc.steps:
                    for f in step.get("eval", ()):
                        if f["mode"] == "train":
                            f["grad"] = "no_grad"
        return sc

    def eval_forward(k):
        if space.few_shapes:
            batch = st.sampled_from(FEW_BATCHES).map(lambda n: [n] * world_size)
        elif space.rank_uniform:
            batch = st.integers(1, 6).map(lambda n: [n] * world_size)
        else:
            batch = st.lists(st.integers(1, 6), min_size=world_size, max_size=world_size)
        grads = [g for g in EVAL_GRAD if not (space.xla_corners and ("eval", g) in XLA_UNSUPPORTED_LOOP)]
        return st.fixed_dictionaries({"at": st.integers(0, k), "grad": st.sampled_from(grads),
                                      "mode": st.sampled_from(EVAL_MODE), "batch": batch})
    return build()


def workloads(space: Space):
    """Hypothesis strategy of workloads (:data:`WORKLOADS`): each dimension drawn apart,
    shrinking towards the plain workload; with ``space.xla_corners`` only the corners XLA
    runtimes train, and without the ``static_graph`` DDP extra no reentrant checkpoint
    (upstream needs ``static_graph`` for it)."""
    from hypothesis import strategies as st

    def allowed(k):
        vals = [v for v in WORKLOADS[k] if not (space.xla_corners and (k, v) in XLA_UNSUPPORTED)]
        if "static_graph" not in space.ddp_extra:
            vals = [v for v in vals if v != "checkpoint_reentrant"]
        return st.sampled_from(vals)
    return st.fixed_dictionaries({k: allowed(k) for k in WORKLOADS})


def explicit_scenarios(world_size: int, space: Space) -> list[Scenario]:
    """Scenarios every run of a case includes (before the generated ones): one per
    dimension a fault hides in, so the default budget always covers them."""
    if space.workload:
        return explicit_workload_scenarios(world_size, space)
    if space.loop:
        return explicit_loop_scenarios(world_size, space)
    w = world_size
    all_b = list(BRANCHES)
    extra = {}
    if "buckets" in space.ddp_extra:
        extra = {"bucket_cap_mb": 0.0005, "gradient_as_bucket_view": True}
    if "comm_hook" in space.ddp_extra:
        extra = {"comm_hook": "allreduce"}

    def sc(steps, optimizer="sgd", find_unused=False, **kw):
        base = dict(seed=11, lr=LRS[optimizer][-1] if optimizer == "sgd" else LRS[optimizer][0],
                    optimizer=optimizer, ddp=dict({"find_unused_parameters": find_unused,
                                                   "broadcast_buffers": True}, **extra),
                    rebind_buffers=False, loss_scale_log2=0, checkpoint_at=None, steps=steps)
        base.update(kw)
        return Scenario(**base)

    def step(batches, plans):
        return {"micro": [{"batch": b, "plan": p} for b, p in zip(batches, plans)]}
    rev = [all_b if r % 2 == 0 else all_b[::-1] for r in range(w)]
    uneven = [3 + 2 * (r % 2) + (r // 2) for r in range(w)]
    out = [
        # long run (faults that start late), plain SGD
        sc([step([[2] * w], [[all_b] * w]) for _ in range(60)]),
        # uneven local batches, rank-dependent hook order, buffers rebound in forward
        sc([step([uneven], [rev]) for _ in range(4)], rebind_buffers=True),
        # accumulation window: branch c used only in the no_sync micro-steps
        sc([step([[2] * w, [2] * w], [[all_b] * w, [["a", "b"]] * w]) for _ in range(3)], find_unused=True),
        # locally unused branch (replica 0 skips b), momentum, checkpoint reload, large loss scale
        sc([step([[2] * w], [[["a", "c"]] + [all_b] * (w - 1)]) for _ in range(5)], optimizer="sgd_momentum",
           find_unused=True, checkpoint_at=2, loss_scale_log2=20),
    ]
    return _finished(out, space)


def _finished(out: list, space: Space) -> list:
    """Explicit scenarios ``out``, validated; with ``space.rank_uniform`` every replica takes
    replica 0's batch size and plan."""
    for e in out:
        if space.rank_uniform:
            for step in e.steps:
                for m in step["micro"]:
                    m["batch"] = [m["batch"][0]] * e.world_size
                    m["plan"] = [list(m["plan"][0]) for _ in range(e.world_size)]
                for f in step.get("eval", ()):  # one graph per forward on every replica
                    f["batch"] = [f["batch"][0]] * e.world_size
        e.validate()
    return out


def explicit_workload_scenarios(world_size: int, space: Space) -> list[Scenario]:
    """The workload case's scenarios every run includes: together they cover every corner of
    :data:`WORKLOADS` (only :data:`XLA_UNSUPPORTED`-free ones with ``space.xla_corners``), each
    with small buckets that split the model, uneven local batches (equal with
    ``space.rank_uniform``) and, but with static_graph (:data:`UPSTREAM_DEFECTS`), an accumulation
    window; 2 optimizer steps (a static-graph fault shows from the second)."""
    w = world_size
    all_b = list(BRANCHES)
    uneven = [2 + (r % 2) + (r // 2) for r in range(w)]

    def sc(workload, optimizer="sgd", static=False, bucket_view=False, find_unused=False, plans=None, **kw):
        plans = plans or [[all_b] * w, [all_b] * w]
        steps = [{"micro": [{"batch": list(uneven), "plan": [list(p) for p in pl]} for pl in plans]} for _ in range(2)]
        base = dict(seed=23, lr=LRS[optimizer][-1] if optimizer == "sgd" else LRS[optimizer][0], optimizer=optimizer,
                    ddp={"find_unused_parameters": find_unused, "broadcast_buffers": True, "bucket_cap_mb": 0.002,
                         "gradient_as_bucket_view": bucket_view, "static_graph": static},
                    rebind_buffers=False, loss_scale_log2=0, checkpoint_at=None, steps=steps,
                    workload=dict(PLAIN_WORKLOAD, **workload))
        base.update(kw)
        return Scenario(**base)
    rev = [all_b if r % 2 == 0 else all_b[::-1] for r in range(w)]
    skip_b = [["a", "c"]] + [all_b] * (w - 1)
    out = [
        # float64 (tight bound), a channels_last conv weight, reentrant checkpoints (static_graph)
        sc({"dtype": "float64", "layout": "channels_last", "graph": "checkpoint_reentrant"}, static=True,
           plans=[[all_b] * w]),  # one micro-step: UPSTREAM_DEFECTS
        # complex64 branch, a transposed head weight, a weight shared by two branches; momentum
        # state (complex), a checkpoint reload
        sc({"dtype": "complex64", "layout": "transposed", "graph": "shared"}, optimizer="sgd_momentum",
           plans=[rev, rev], checkpoint_at=0),
        # sparse Embedding gradients accumulated under no_sync, non-reentrant checkpoints, a branch
        # one replica skips (find_unused_parameters), momentum
        sc({"grad": "sparse", "graph": "checkpoint_nonreentrant"}, optimizer="sgd_momentum",
           find_unused=True, plans=[skip_b, skip_b]),
        # a bfloat16 branch between float32 layers, sparse EmbeddingBag gradients, each branch
        # applied twice, gradient_as_bucket_view, rank-dependent hook order, loss scale 2^20
        sc({"dtype": "bfloat16", "grad": "sparse_bag", "graph": "applied_twice"}, bucket_view=True,
           plans=[rev, rev], loss_scale_log2=20),
    ]
    if space.xla_corners:
        out = [e for e in out if not xla_unsupported(e.workload)]
    return _finished(out, space)


def explicit_loop_scenarios(world_size: int, space: Space) -> list[Scenario]:
    """The loop case's scenarios every run includes: together they hold every value of
    :data:`LOOPS`, ``sgd_wd``, a learning-rate drop, forwards without backward of each grad mode
    and module mode (before, inside and after an accumulation window) and several synced
    backwards in one step, each where a fault it reveals shows (see the comments)."""
    w = world_size
    all_b = list(BRANCHES)
    uneven = [2 + (r % 2) + (r // 2) for r in range(w)]

    def sc(steps, optimizer="sgd", find_unused=True, module=None, checkpoint_at=None, **loop):
        return Scenario(seed=31, lr=LRS[optimizer][-1] if optimizer.startswith("sgd") else LRS[optimizer][0],
                        optimizer=optimizer, ddp={"find_unused_parameters": find_unused, "broadcast_buffers": True},
                        rebind_buffers=False, loss_scale_log2=0, checkpoint_at=checkpoint_at, steps=steps,
                        loop=dict(PLAIN_LOOP, **loop), module=dict(PLAIN_MODULE, **(module or {})))

    def micro(plan, sync=None, batch=None):
        m = {"batch": list(batch or uneven), "plan": [list(plan)] * w}
        if sync is not None:
            m["sync"] = sync
        return m

    def ev(at, grad, mode):
        return {"at": at, "grad": grad, "mode": mode, "batch": list(uneven)}
    out = [
        # zero gradients, not None: branch c used at steps 1 and 3 only; at steps 2 and 4 its zero
        # gradient must stay zero (weight decay still moves it; a DDP setting it None skips it); an
        # eval-mode validation forward before each step (DDP broadcasts the buffers there, so the
        # next training forward need not); a learning-rate drop. The module returns a dataclass
        # (find_unused_parameters must walk it) and keeps 'ema' out of its state dict, across a
        # checkpoint reload
        sc([{"micro": [micro(all_b if s % 2 == 0 else ["a", "b"])], "eval": [ev(0, "no_grad", "eval")]}
            for s in range(4)], optimizer="sgd_wd", zero_grad="zeros", lr_drop_at=2, checkpoint_at=1,
           module={"output": "dataclass", "buffers": "non_persistent"}),
        # None gradients: branch c never used keeps None under AdamW's decoupled weight decay; two synced
        # backwards per step (branch a reached only by the first: its averaged gradient must stay);
        # gradient clipping on the synced gradients
        # (a dict output, a forward pre-hook on the wrapped module)
        sc([{"micro": [micro(["a", "b"], sync=True), micro(["b"])]} for _ in range(3)], optimizer="adamw",
           clip="norm", module={"output": "dict", "hook": "pre_hook"}),
        # training forwards and backwards in eval mode (gradients still averaged); a no_grad forward in
        # train mode inside an accumulation window (it updates the buffers, and the next forward, not
        # following a synced one, does not broadcast them); an inference_mode forward after the last
        # backward
        sc([{"micro": [micro(all_b), micro(all_b)], "eval": [ev(1, "no_grad", "train"), ev(2, "inference_mode", "eval")]}
            for _ in range(3)], find_unused=False, module_mode="eval"),
        # clipping where it binds, a train-mode no_grad forward before each step, momentum
        sc([{"micro": [micro(all_b)], "eval": [ev(0, "no_grad", "train")]} for _ in range(4)],
           optimizer="sgd_momentum", find_unused=False, clip="norm"),
    ]
    if space.xla_corners:  # no inference_mode there (XLA_UNSUPPORTED_LOOP): no_grad in its place
        for e in out:
            for st in e.steps:
                for f in st.get("eval", ()):
                    f["grad"] = "no_grad"
    return _finished(out, space)


def scenario_tolerance(runtime: str, sc: Scenario):
    """The tolerance row of ``sc``'s workload dtype (``conformance.tolerances``: model
    ``scenario``; complex64 is float32 precision)."""
    return lookup(runtime, "scenario", WORKLOAD_TOLERANCE.get(sc.workload["dtype"], "float32"))


#: Workload dtypes with their own tolerance row (the others: ``float32``).
WORKLOAD_TOLERANCE = {"float64": "float64", "bfloat16": "bf16-mixed"}


def judged_on(sc, vs: list, first_sc, first_vs: list, worst: dict, examples: int) -> list:
    """``[(verdict, scenario it was judged on or None)]`` for a failing scenario case.
    Shrinking keeps what fails, not what trains: a sibling check ``vacuous`` on the minimal
    failing scenario ``sc`` takes its verdict over the passing scenarios (``worst``; scenario
    None), else its verdict on the first, unshrunk failing scenario when that one is not
    vacuous; only when neither could judge it does it stay vacuous."""
    out = []
    for v in vs:
        if v.status == "vacuous" and v.check in worst:
            w = worst[v.check]
            w.reason = (f"{examples} scenario(s) judged; the minimal failing scenario moved too "
                        "little to judge this check")
            out.append((w, None))
            continue
        if v.status == "vacuous":
            first = next(u for u in first_vs if u.check == v.check)
            if first.status != "vacuous":
                out.append((first, first_sc))
                continue
        out.append((v, sc))
    return out


def run_scenario_case(space: Space, target, tol, agreement_atol: float, max_examples: int,
                      shrink: bool = True) -> list:
    """Run the explicit scenarios, then ``max_examples`` generated ones, on ``target``
    (a :class:`conformance.cases.search.SearchWorld`), each judged with ``tol(scenario)`` (its
    workload's tolerance row); Hypothesis shrinks a failing scenario to a minimal one (unless
    ``shrink`` is false: the first failing one).

    Returns one :class:`~conformance.verdict.Verdict` per :data:`~conformance.cases.checks.SCENARIO_CHECKS`
    (case fields filled by the caller): on a pass, the worst deviation over all
    examples; on a failure, the minimal failing scenario's verdicts, with the
    scenario JSON in ``example`` and a reproducer in ``diagnosis``.

    Raises:
        Unsupported: the implementation cannot serve the scenarios.
    """
    from hypothesis import given

    worst: dict = {}
    state = {"examples": 0, "vacuous": 0, "failing": None, "unsupported": {}}  # + "crashed": a Scenario

    def check(sc: Scenario):
        try:
            results = target.run(scenario_task, scenario=sc.to_json())
        except Unsupported as exc:
            # The implementation lacks a corner, a keyword or a method this example needs: this
            # example is unsupported, the others still run (SearchWorld would re-raise it for all).
            target.error = None
            state["unsupported"].setdefault(str(exc), sc.describe_workload() or "plain workload")
            return
        except Exception:
            # the first scenario a replica failed on: the target re-raises its failure for every later
            # example, so Hypothesis's "minimal" example of a crash is not one that crashes
            state.setdefault("crashed", sc)
            raise
        vs = judge_scenario(sc, results, tol(sc), agreement_atol=agreement_atol)
        state["examples"] += 1
        bad = [v for v in vs if v.status == "fail"]
        if bad:
            state["failing"] = (sc, vs)
            state.setdefault("first_failing", (sc, vs))  # unshrunk: it trained enough to judge
            raise AssertionError("; ".join(f"{v.check}: {v.reason}" for v in bad))
        if any(v.status == "vacuous" for v in vs if v.check == "params"):
            state["vacuous"] += 1
            return
        for v in vs:
            if v.status == "pass" and v.max_dev == v.max_dev and (
                    v.check not in worst or v.max_dev > worst[v.check].max_dev):
                worst[v.check] = v

    # Generated scenarios first (a failure is shrunk to a minimal scenario), then the
    # explicit ones (deterministic coverage of every dimension; reported as they are).
    # max_examples 0: the explicit scenarios only (Hypothesis refuses a zero budget)
    test = kit_settings(max_examples, shrink)(given(sc=scenarios(target.world_size, space))(check)) \
        if max_examples > 0 else None

    def explicit():
        for e in explicit_scenarios(target.world_size, space):
            check(e)
    try:
        if test is not None:
            test()
        explicit()
    except Exception as exc:
        if isinstance(target.error, Unsupported):
            raise target.error from None
        if state["failing"] is None:  # a replica failure (cached in the target) or a kit error
            crashed = state.get("crashed")
            text = ("\n".join(getattr(exc, "__notes__", [])) + f"\n{type(exc).__name__}: {exc}" if crashed is None else
                    f"the scenario a replica failed on ({len(crashed.steps)} step(s), world size "
                    f"{crashed.world_size}; not shrunk: a replica failure is re-raised for later examples):\n"
                    f"{json.dumps(crashed.to_json())}\nreproduce: python -m conformance replay SCENARIO.json "
                    f"--ddp {target.impl} --runtime {target.runtime}\n{type(exc).__name__}: {exc}")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            corners = crashed.describe_workload() if crashed is not None else ""
            dims = f" ({corners})" if corners else ""
            return [Verdict("", c, "", "", "scenario", target.world_size, "fail",
                            reason=f"replica failure on a scenario{dims}: {first}", diagnosis=text.strip(),
                            example=None if crashed is None else crashed.to_json())
                    for c in SCENARIO_CHECKS]
        sc, vs = state["failing"]
        out = []
        for v, on in judged_on(sc, vs, *state["first_failing"], worst, state["examples"]):
            if on is None:
                out.append(v)
                continue
            what = "minimal failing" if on is sc and shrink else "failing"
            if on is not sc:
                what += " (unshrunk; the minimal one moved too little to judge this check)"
            v.example = on.to_json()
            v.diagnosis = (f"{what} scenario ({len(on.steps)} step(s), world size {on.world_size}):\n"
                           f"{json.dumps(on.to_json())}\nreproduce: python -m conformance replay SCENARIO.json --ddp "
                           f"{target.impl} --runtime {target.runtime}" + (f"\n{v.diagnosis}" if v.diagnosis else ""))
            out.append(v)
        return out
    n = state["examples"]
    unsup = state["unsupported"]
    if unsup and not n:
        raise Unsupported("every scenario: " + "; ".join(f"{why} ({wl})" for why, wl in unsup.items()))
    out = []
    for c in SCENARIO_CHECKS:
        v = worst.get(c) or Verdict("", c, "", "", "scenario", target.world_size, "pass")
        v.reason = f"{n} scenario(s)" + (f", {state['vacuous']} vacuous (discarded)" if state["vacuous"] else "")
        if unsup:  # the corners this implementation lacks, said where the pass is reported
            v.reason += ("; unsupported corner(s) skipped: "
                         + "; ".join(f"{wl}: {why}" for why, wl in list(unsup.items())[:3]))
        if n == state["vacuous"]:
            v.status, v.reason = "vacuous", f"all {n} scenario(s) moved too little to fail"
        out.append(v)
    return out


def evaluate_scenario(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``scenario`` row: its space's scenarios within the session profile's
    budget, or with ``overrides["scenario"]`` that one scenario (``python -m conformance
    replay``); ``overrides["shrink"]``: shrink a failing scenario, default true."""
    agree = lookup(runtime, "scenario", "agreement").atol
    if "scenario" in overrides:  # one given scenario (python -m conformance replay)
        sc = overrides["scenario"]
        results = session.run(runtime, w, scenario_task, timeout=case.timeout, impl=impl, scenario=sc.to_json())
        return None if results is None else judge_scenario(sc, results, scenario_tolerance(runtime, sc),
                                                           agreement_atol=agree)
    target = SearchWorld(lambda fn, **p: session.run(runtime, w, fn, timeout=case.timeout, **p), runtime, w, impl)
    space = Space(**case.args.get("space", {}))
    rt = get_runtime(runtime)
    # Where each distinct graph is compiled: few shapes, XLA's corners (docs/runtimes/pjrt.md).
    space = replace(space, rank_uniform=space.rank_uniform or rt.uniform_graphs,
                    few_shapes=space.few_shapes or rt.compiled_graphs,
                    xla_corners=space.xla_corners or rt.compiled_graphs)
    # The workload draw has its own budget column (where each distinct graph is compiled, every
    # drawn workload is new graphs: explicit scenarios only by default).
    if space.loop:  # deeper programs under a larger profile
        space = replace(space, max_pattern=loop_depth(session.profile))
    examples = (workload_examples(session.profile, rt.compiled_graphs) if space.workload
                else loop_examples(session.profile, space.budget) if space.loop and rt.compiled_graphs
                else scenario_examples(session.profile, space.budget))
    return run_scenario_case(space, target, lambda sc: scenario_tolerance(runtime, sc), agree, examples,
                             overrides.get("shrink", True))


def _scenario_problem(case) -> str | None:
    why = space_problem(case.args.get("space", {}))
    return f"scenario space: {why}" if why else None


KIND = Kind("scenario", evaluate_scenario, validate=_scenario_problem,
            requires=lambda case: space_requires(case.args.get("space", {})), searches=True)
