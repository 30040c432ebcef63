"""The scenario format: JSON data, its dimensions (workload, loop, module) and validation.

See :mod:`conformance.cases.scenario.scenario` for what a scenario is and how it is judged.

Long because it is one data table per dimension (values, phrases, what XLA refuses) beside the one
validator that reads them all: a replayed file is checked against the same tables it was drawn from."""
from __future__ import annotations

from collections import namedtuple
from dataclasses import asdict, dataclass, field
import json
import math

from conformance.cases.shared.loop import ALL_OPTIMIZERS

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
            "static_graph", "comm_hook", "init_sync", "forward_sync_buffers", "batched_grad_copy",
            "bucket_cap_mb_list", "skip_all_reduce_unused_params"}
#: torch's default of each DDP keyword a scenario may hold: a scenario passes the others to the DDP.
DDP_DEFAULTS = {"find_unused_parameters": False, "broadcast_buffers": None, "bucket_cap_mb": None,
                "gradient_as_bucket_view": False, "static_graph": False, "init_sync": True,
                "forward_sync_buffers": None, "batched_grad_copy": False, "bucket_cap_mb_list": None,
                "skip_all_reduce_unused_params": False}
#: Keywords whose value must be a bool, or a bool or None.
BOOL_KEYS = ("find_unused_parameters", "gradient_as_bucket_view", "static_graph", "init_sync", "batched_grad_copy",
             "skip_all_reduce_unused_params")
OPTIONAL_BOOL_KEYS = ("broadcast_buffers", "forward_sync_buffers")


def buffer_sync(ddp: dict) -> tuple[bool, bool]:
    """``(at construction, before a forward)``: whether the DDP keywords ``ddp`` broadcast rank
    0's buffers then, as torch 2.13's ``DistributedDataParallel.__init__`` decides:
    ``forward_sync_buffers`` (None: follow ``broadcast_buffers``) rules the forward sync and
    leaves the construction sync on; ``broadcast_buffers=False`` (deprecated) turns both off;
    ``init_sync=False`` skips the whole construction sync (parameters too)."""
    bcast = ddp.get("broadcast_buffers")
    bcast = True if bcast is None else bcast
    fwd = ddp.get("forward_sync_buffers")
    at_forward = bcast if fwd is None else fwd
    at_init = bool(ddp.get("init_sync", True)) and (fwd is not None or bcast)
    return at_init, at_forward
STEP_KEYS = {"micro"}
#: Keys a step may add (the loop programs): forwards without backward before its micro-steps.
STEP_OPTIONAL = {"eval"}
MICRO_KEYS = {"batch", "plan"}
#: Keys a micro-step may add: ``sync`` (default: only the window's last micro-step is synced,
#: the others run under ``no_sync()``; true: a synced backward of its own); ``forwards``
#: (default 1): how many forwards through the DDP, each on its own data, before the micro-step's
#: one backward of their summed losses (a GAN discriminator on fake and real batches).
MICRO_OPTIONAL = {"sync", "forwards"}
#: The most forwards before one backward drawn or accepted (:data:`MICRO_OPTIONAL` ``forwards``).
MAX_FORWARDS = 3
#: Data of forward ``k`` (0-based, ``k >= 1``) of micro-step ``j``: micro index ``FORWARD_DATA * k + j``.
FORWARD_DATA = 2000

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
#:   teacher:     ``none``, or ``frozen``: a second DDP in the loop (knowledge distillation, a mean
#:                teacher): the scenario model built from :data:`TEACHER_SALT` seeds, wrapped by the
#:                same implementation, kept in eval mode and never trained; before each training
#:                forward it runs under ``no_grad`` on the same inputs, and the loss's target is
#:                ``(y + its prediction) / 2``. Its forwards must not touch the trained DDP's state
#:                (torch keeps ``require_forward_param_sync`` per instance);
#:   lr_drop_at:  ``None``, or the 0-based step from which the learning rate is ``lr * LR_DROP``
#:                (set in the optimizer's ``param_groups`` before the step, as a scheduler does).
LOOPS = {"zero_grad": ("set_to_none", "zeros"), "module_mode": ("train", "eval"), "clip": ("none", "norm"),
         "teacher": ("none", "frozen")}
#: The build salt of the teacher model (:data:`LOOPS` ``teacher``; a checkpoint reload's is 1).
TEACHER_SALT = 2
PLAIN_LOOP = dict({k: v[0] for k, v in LOOPS.items()}, lr_drop_at=None)
CLIP_NORM, LR_DROP = 0.25, 0.5
#: The module dimension drawn with the loop programs (issue 25; docs/scenarios.md): what the user's
#: module looks like to the DDP. First values: the plain module.
#:   output:      forward returns the prediction tensor, a dict ``{"pred", "hidden" (detached), "note" (a
#:                str)}``, a :class:`ScenarioOutput` dataclass (``pred``, ``hidden``, ``calls``: an int) or a
#:                :data:`ScenarioPair` namedtuple (``pred``, ``hidden``: a tensor that needs no grad, ``tag``:
#:                a str); the loss reads ``pred`` (``find_unused_parameters`` must walk the structure);
#:   buffers:     ``ema`` registered ``persistent`` or ``non_persistent`` (absent from ``state_dict()``:
#:                a checkpoint reload leaves the new module's own, as construction made it);
#:   hook:        ``none`` or ``pre_hook``: a forward pre-hook on the wrapped module halves the input
#:                (it runs only when the wrapper calls ``module(...)``);
#:   kwargs:      forward keywords the module uses: ``none``, ``scale`` (``scale=KW_SCALE``, a float
#:                multiplying the stem's activation) or ``mask`` (``mask=``, a float 0/1 tensor ``[n]``
#:                from the data zeroing some samples' hidden activation, :func:`~.model.scenario_mask`);
#:                a DDP must pass them on (``DistributedDataParallel.forward(*inputs, **kwargs)``);
#:   int_buffer:  ``none`` or ``samples``: an int64 buffer ``seen`` counting the samples of the training
#:                forwards (``+= n``, the local batch: rank-dependent with uneven batches), starting
#:                rank-dependent (:func:`~.model.seen_start`); DDP broadcasts it with the float buffers;
#:   parametrize: ``none``, ``symmetric`` (``torch.nn.utils.parametrize.register_parametrization`` on
#:                ``branch.a``'s weight: trained tensor ``branch.a.parametrizations.weight.original``)
#:                or ``weight_norm`` (``torch.nn.utils.parametrizations.weight_norm`` on the head:
#:                ``head.parametrizations.weight.original0`` (g) and ``original1`` (v));
#:   params:      ``modules`` or ``containers``: also parameters held in an ``nn.ParameterList``
#:                (``gains.0``, ``gains.1``: per-feature gains) and an ``nn.ParameterDict``
#:                (``offsets.h``, ``offsets.out``: offsets added to the hidden layer and the output).
#:   buffer_use:  ``none`` (the buffers never feed the output), or ``centre``: a training forward
#:                subtracts the updated ``ema`` from the hidden layer (a running centring; a
#:                subtraction saves nothing for backward, so a buffer broadcast between two forwards
#:                before one backward is legal): which buffers a forward starts from moves the parameters.
#: Float buffers rebound in forward are the scenario's ``rebind_buffers`` (every scenario case draws it;
#: with ``int_buffer`` ``samples`` the int64 ``seen`` is rebound too).
MODULES = {"output": ("tensor", "dict", "dataclass", "namedtuple"), "buffers": ("persistent", "non_persistent"),
           "hook": ("none", "pre_hook"), "kwargs": ("none", "scale", "mask"), "int_buffer": ("none", "samples"),
           "parametrize": ("none", "symmetric", "weight_norm"), "params": ("modules", "containers"),
           "buffer_use": ("none", "centre"), "grad_hook": ("none", "after_wrap")}
PLAIN_MODULE = {k: v[0] for k, v in MODULES.items()}
#: ``module["grad_hook"] == "after_wrap"``: the user's gradient hook multiplies this parameter's
#: gradient by this factor (a power of two: exact), registered on the module after wrapping.
GRAD_HOOK_PARAM, GRAD_HOOK_SCALE = "head.bias", 0.5
#: The ``scale=`` keyword's value (``module["kwargs"] == "scale"``).
KW_SCALE = 0.5
MODULE_PHRASES = {"dict": "forward returns a dict (the loss reads 'pred')",
                  "dataclass": "forward returns a dataclass (the loss reads field 'pred')",
                  "namedtuple": "forward returns a namedtuple (the loss reads 'pred'; a str and a tensor "
                                "needing no grad beside it)",
                  "non_persistent": "buffer 'ema' registered persistent=False (not in state_dict())",
                  "pre_hook": "a forward pre-hook on the wrapped module",
                  "scale": f"forward keyword scale={KW_SCALE} (the module multiplies by it)",
                  "mask": "forward keyword mask= (a per-sample 0/1 tensor the module applies)",
                  "samples": "int64 buffer 'seen' counting the local samples (+= n in forward)",
                  "symmetric": "branch.a.weight parametrized (torch.nn.utils.parametrize, symmetric)",
                  "weight_norm": "head.weight parametrized (torch.nn.utils.parametrizations.weight_norm)",
                  "containers": "parameters held in an nn.ParameterList ('gains') and an nn.ParameterDict "
                                "('offsets')",
                  "centre": "buffer 'ema' feeds the output (a training forward subtracts it from the hidden layer)",
                  "after_wrap": f"a gradient hook (Tensor.register_hook, x{GRAD_HOOK_SCALE}) the user registers on "
                                f"'{GRAD_HOOK_PARAM}' after wrapping"}


@dataclass
class ScenarioOutput:
    """The scenario model's output with ``module["output"] == "dataclass"``: ``pred`` ``[n,
    OUT_FEATURES]`` (what the loss reads), ``hidden`` ``[n, HIDDEN]`` detached, ``calls`` an int (forwards so far)."""
    pred: object
    hidden: object
    calls: int


#: The scenario model's output with ``module["output"] == "namedtuple"``: ``pred`` (what the loss
#: reads), ``hidden`` ``[n, HIDDEN]`` detached (a tensor that needs no grad), ``tag`` a str.
ScenarioPair = namedtuple("ScenarioPair", ["pred", "hidden", "tag"])


def prediction_of(out):
    """The tensor the loss reads from a scenario model's output (:data:`MODULES` ``output``)."""
    if isinstance(out, (ScenarioOutput, ScenarioPair)):
        return out.pred
    return out["pred"] if isinstance(out, dict) else out


#: A forward without backward (``step["eval"]``): ``{"at": j, "grad": ..., "mode": ..., "batch": [n
#: per replica]}`` runs before micro-step ``j`` (``j`` = the window's length: after the last
#: backward, before the step) under ``grad`` with the module in ``mode``, through the DDP, output
#: discarded. In ``train`` mode it updates the buffers (a metric computed under ``no_grad`` in train
#: mode). ``grad`` ``enabled``: autograd on and no backward (validation written without
#: ``no_grad``); it runs outside ``no_sync()``, so DDP counts it as a synced training forward and
#: broadcasts buffers at the next forward; under ``no_grad`` / ``inference_mode`` it does not
#: (``_pre_forward``: ``require_forward_param_sync``). ``raising``: grad enabled, and the module
#: raises after its buffers moved (a bad batch found mid-forward, on every rank; the loop catches
#: it and goes on): torch sets the flag only after the module returns, so it keeps the previous
#: forward's, and the next forward broadcasts if that one was a synced training forward.
EVAL_KEYS = {"at", "grad", "mode", "batch"}
EVAL_GRAD = ("no_grad", "inference_mode", "enabled", "raising")
EVAL_MODE = ("eval", "train")
#: Data of a forward without backward: micro index ``EVAL_DATA + e`` (apart from the micro-steps').
EVAL_DATA = 1000


def grad_mode(grad: str):
    """A new context manager for a forward without backward's ``grad`` (:data:`EVAL_GRAD`):
    ``torch.no_grad()``, ``torch.inference_mode()`` or ``torch.enable_grad()``."""
    import torch
    return {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "enabled": torch.enable_grad,
            "raising": torch.enable_grad}[grad]()


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
    ("enabled_forward", "no_sync"): "torch's DDP with find_unused_parameters=True raises 'Expected to have "
                                    "finished reduction in the prior iteration' at the forward after a "
                                    "grad-enabled forward no backward followed, then a no_sync() backward that "
                                    "left a parameter unused (torch 2.13; docs/findings.md 15)",
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
            backward, :data:`EVAL_KEYS`) and a micro-step ``"sync"`` and ``"forwards"``
            (:data:`MICRO_OPTIONAL`).
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

    def forwards(self, s: int, j: int) -> int:
        """How many forwards micro-step ``j`` of step ``s`` runs before its one backward."""
        return self.steps[s]["micro"][j].get("forwards", 1)

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
        if isinstance(d.get("loop"), dict):  # a file from before a loop dimension: its plain value
            d = dict(d, loop=dict({k: v for k, v in PLAIN_LOOP.items() if k not in d["loop"]}, **d["loop"]))
        if isinstance(d.get("module"), dict):  # a file from before a module dimension: its plain value
            d = dict(d, module=dict({k: v for k, v in PLAIN_MODULE.items() if k not in d["module"]}, **d["module"]))
        s = cls(**d)
        s.validate()
        return s

    def validate(self) -> None:
        """Raises ScenarioError naming the first bad value."""
        if self.optimizer not in ALL_OPTIMIZERS:
            raise ScenarioError(f"optimizer {self.optimizer!r}: one of {ALL_OPTIMIZERS}")
        if not isinstance(self.ddp, dict) or set(self.ddp) - DDP_KEYS:
            raise ScenarioError(f"unknown DDP keyword(s) {sorted(set(self.ddp) - DDP_KEYS)}; known: {sorted(DDP_KEYS)}")
        for k in BOOL_KEYS:
            if not isinstance(self.ddp.get(k, False), bool):
                raise ScenarioError(f"DDP keyword {k} {self.ddp[k]!r}: true or false")
        for k in OPTIONAL_BOOL_KEYS:
            if self.ddp.get(k) is not None and not isinstance(self.ddp[k], bool):
                raise ScenarioError(f"DDP keyword {k} {self.ddp[k]!r}: true, false or null")
        caps = self.ddp.get("bucket_cap_mb_list")
        if caps is not None and not (isinstance(caps, list) and caps and all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 for c in caps)):
            raise ScenarioError(f"bucket_cap_mb_list {caps!r}: a non-empty list of positive MiB")
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
                if "forwards" in m and not (isinstance(m["forwards"], int) and not isinstance(m["forwards"], bool)
                                            and 1 <= m["forwards"] <= MAX_FORWARDS):
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: forwards {m['forwards']!r}: "
                                        f"an integer 1..{MAX_FORWARDS}")
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
        if md["parametrize"] != "none" and (self.workload["graph"] == "shared"
                                            or self.workload["layout"] == "transposed"):
            raise ScenarioError(f"module parametrize {md['parametrize']!r} with workload "
                                f"{workload_corners(self.workload)}: a parametrized weight that is shared "
                                "or a transposed view is not drawn (the parametrization would rebuild it)")
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
        if self.ddp.get("skip_all_reduce_unused_params"):
            plans = {tuple(sorted(p)) for st in self.steps for m in st["micro"] for p in m["plan"]}
            if len(plans) != 1:  # torch: else replicas desynchronise or hang
                raise ScenarioError("skip_all_reduce_unused_params=True: every replica and micro-step leaves "
                                    "the same branches unused")

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
        for j in range(len(micro)):
            if self.forwards(s, j) > 1:
                parts.append(f"{self.forwards(s, j)} forwards before one backward at micro-step {j + 1} "
                             f"({'synced' if self.synced(s, j) else 'no_sync'})")
        for e, f in enumerate(self.steps[s].get("eval", ())):
            where = ("after the last backward, before the step" if f["at"] == len(micro)
                     else f"before micro-step {f['at'] + 1}")
            if f["grad"] == "raising":
                parts.append(f"a forward that raises after the buffers moved (skipped) in {f['mode']} mode {where}")
                continue
            grad = "grad enabled" if f["grad"] == "enabled" else f["grad"]
            parts.append(f"a forward without backward under {grad} in {f['mode']} mode {where}")
        parts += [MODULE_PHRASES[v] for k, v in self.module.items() if v != PLAIN_MODULE[k]]
        lp = self.loop
        if lp["zero_grad"] == "zeros":
            parts.append("zero_grad(set_to_none=False): zero gradients, not None")
        if lp["module_mode"] == "eval":
            parts.append("training forwards and backwards in eval mode")
        if lp["clip"] == "norm":
            parts.append(f"clip_grad_norm_(max_norm={CLIP_NORM}) on the synced gradients")
        if lp["teacher"] == "frozen":
            parts.append("a second DDP (a frozen teacher, eval mode) runs under no_grad before each training "
                         "forward; the target blends in its prediction")
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
