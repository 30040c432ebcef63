"""The scenario's dimensions: each one's values (the first is the plain one Hypothesis shrinks
towards), how a verdict names them, what a runtime whose graphs are compiled (XLA) refuses and
what upstream DDP fails; the scenario model's sizes, output structures and data indices.

The JSON data that holds a choice of them, and its validation against these tables:
:mod:`.format`; the model they shape: :mod:`.model`. docs/scenarios.md describes each axis.
"""
from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass, fields

from conformance.cases.scenario.statements import statement_phrases, statement_values

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

#: The most forwards before one backward drawn or accepted (:data:`~.format.MICRO_OPTIONAL` ``forwards``).
MAX_FORWARDS = 3
#: Data of forward ``k`` (0-based, ``k >= 1``) of micro-step ``j``: micro index ``FORWARD_DATA * k + j``.
FORWARD_DATA = 2000

#: The loop dimension: what a user's training loop does around the DDP besides forward, backward
#: and ``optimizer.step()`` (each value in words: :data:`LOOP_PHRASES`; its torch semantics and the
#: fault it reveals: docs/scenarios.md, "The loop programs"; the statements surveyed from the
#: ecosystem's programs: :mod:`.statements`), plus ``lr_drop_at``: ``None`` or the
#: 0-based step from which the learning rate is ``lr * LR_DROP``. First values: the plain loop.
LOOPS = {"zero_grad": ("set_to_none", "zeros"), "module_mode": ("train", "eval"), "clip": ("none", "norm"),
         "teacher": ("none", "frozen"), **statement_values()}
#: The build salt of the teacher model (:data:`LOOPS` ``teacher``; a checkpoint reload's is 1).
TEACHER_SALT = 2
PLAIN_LOOP = dict({k: v[0] for k, v in LOOPS.items()}, lr_drop_at=None)
CLIP_NORM, LR_DROP = 0.25, 0.5
#: How a verdict names each non-plain loop value (``lr_drop_at``: from its step on).
LOOP_PHRASES = {("zero_grad", "zeros"): "zero_grad(set_to_none=False): zero gradients, not None",
                ("module_mode", "eval"): "training forwards and backwards in eval mode",
                ("clip", "norm"): f"clip_grad_norm_(max_norm={CLIP_NORM}) on the synced gradients",
                ("teacher", "frozen"): "a second DDP (a frozen teacher, eval mode) runs under no_grad before each "
                                       "training forward; the target blends in its prediction",
                **statement_phrases()}
#: The module dimension drawn with the loop programs: what the user's module looks like to the DDP
#: (each value in words: :data:`MODULE_PHRASES`; its torch semantics: docs/scenarios.md, "The module
#: axis"). First values: the plain module. Float buffers rebound in forward are the scenario's
#: ``rebind_buffers`` (with ``int_buffer`` ``samples`` the int64 ``seen`` too).
MODULES = {"output": ("tensor", "dict", "dataclass", "namedtuple", "model_output"),
           "buffers": ("persistent", "non_persistent"), "hook": ("none", "pre_hook"), "kwargs": ("none", "scale", "mask"), "int_buffer": ("none", "samples"),
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
                  "model_output": "forward returns an OrderedDict subclass that is a dataclass (as HF "
                                  "transformers' ModelOutput; the loss reads 'pred')",
                  "non_persistent": "buffer 'ema' registered persistent=False (not in state_dict())",
                  "pre_hook": "a forward pre-hook on the wrapped module",
                  "scale": f"forward keyword scale={KW_SCALE} (the module multiplies by it)",
                  "mask": "forward keyword mask= (a per-sample 0/1 tensor the module applies)",
                  "samples": "int64 buffer 'seen' counting the local samples (+= n in forward)",
                  "symmetric": "branch.a.weight parametrized (torch.nn.utils.parametrize, symmetric)",
                  "weight_norm": "head.weight parametrized (torch.nn.utils.parametrizations.weight_norm)",
                  "containers": "parameters held in an nn.ParameterList ('gains') and an nn.ParameterDict "
                                "('offsets')",
                  "centre": "buffer 'ema' feeds the output (subtracted from the hidden layer: the updated one in training, the running one in eval mode)",
                  "after_wrap": f"a gradient hook (Tensor.register_hook, x{GRAD_HOOK_SCALE}) the user registers on "
                                f"'{GRAD_HOOK_PARAM}' after wrapping"}


class BadBatch(RuntimeError):
    """Raised by the scenario model's forward with ``bad=True``, after its buffers moved: the
    loop programs' skipped batch (:data:`EVAL_GRAD` ``raising``)."""


@dataclass
class ScenarioOutput:
    """The scenario model's output with ``module["output"] == "dataclass"``: ``pred`` ``[n,
    OUT_FEATURES]`` (what the loss reads), ``hidden`` ``[n, HIDDEN]`` detached, ``calls`` an int (forwards so far)."""
    pred: object
    hidden: object
    calls: int


@dataclass
class ScenarioModelOutput(OrderedDict):
    """The scenario model's output with ``module["output"] == "model_output"``, shaped as HF
    transformers' ``ModelOutput``: a dataclass subclassing ``OrderedDict`` whose set fields are
    also its items (``out.pred`` and ``out["pred"]``); ``pred`` ``[n, OUT_FEATURES]`` (what the
    loss reads), ``hidden`` ``[n, HIDDEN]`` detached. ``torch.utils._pytree`` knows ``OrderedDict``
    by exact type only, so it sees this as a leaf (pytorch/pytorch#106690)."""
    pred: object = None
    hidden: object = None

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) is not None:
                self[f.name] = getattr(self, f.name)


#: Output structures ``torch.utils._pytree`` treats as leaves (no tensor found inside): torch's
#: DDP with ``static_graph=True`` never reduces its first iteration behind them (docs/findings.md 25).
PYTREE_LEAF_OUTPUTS = ("dataclass", "model_output")


#: The scenario model's output with ``module["output"] == "namedtuple"``: ``pred`` (what the loss
#: reads), ``hidden`` ``[n, HIDDEN]`` detached (a tensor that needs no grad), ``tag`` a str.
ScenarioPair = namedtuple("ScenarioPair", ["pred", "hidden", "tag"])


def structured_output(kind: str, pred, hidden, tag: str, calls: int):
    """``pred`` returned in the output structure ``kind`` (:data:`MODULES` ``output``) beside
    ``hidden`` detached, with ``tag`` (a str member) and ``calls`` (an int member) where the
    structure holds one."""
    if kind == "namedtuple":
        return ScenarioPair(pred=pred, hidden=hidden.detach(), tag=tag)
    if kind == "dict":
        return {"pred": pred, "hidden": hidden.detach(), "note": tag}
    if kind == "dataclass":
        return ScenarioOutput(pred=pred, hidden=hidden.detach(), calls=calls)
    if kind == "model_output":
        return ScenarioModelOutput(pred=pred, hidden=hidden.detach())
    return pred


def prediction_of(out):
    """The tensor the loss reads from a scenario model's output (:data:`MODULES` ``output``; a
    topology's several outputs, a tuple: their sum, which a structure may hold as its ``pred``)."""
    if isinstance(out, (ScenarioOutput, ScenarioPair)):
        return prediction_of(out.pred)
    if isinstance(out, dict):
        return prediction_of(out["pred"])
    if isinstance(out, tuple):
        return sum(out[1:], out[0])
    return out


#: A forward without backward (``step["eval"]``, keys :data:`~.format.EVAL_KEYS`): ``{"at": j,
#: "grad": ..., "mode": ..., "batch": [n per replica]}`` runs before micro-step ``j`` (``j`` = the
#: window's length: after the last backward, before the step) under ``grad`` (``enabled``: a
#: validation written without ``no_grad``; ``raising``: grad enabled, and the module raises after its
#: buffers moved, a bad batch the loop skips) with the module in ``mode``, through the DDP, output
#: discarded. What each does to DDP's buffer broadcast (``require_forward_param_sync``): :mod:`.oracle`.
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

#: The workload dimension: what the scenario model's parameters and graph are (each value in words:
#: :data:`WORKLOAD_PHRASES`; what it changes in the model: docs/scenarios.md, "The workload axis").
#: Each key's first value is the plain workload Hypothesis shrinks towards.
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
#: Corners a runtime whose every distinct graph is compiled (XLA: PJRT, XRT) cannot train, with the
#: reason (docs/scenarios.md, PJRT): never drawn there; a replayed one is ``unsupported``.
XLA_UNSUPPORTED = {
    ("dtype", "bfloat16"): "the PJRT CPU device's collectives have no bfloat16 (xm.all_reduce: "
                           "\"AllReduce for datatype 'bf16' is not supported\")",
    ("grad", "sparse"): "torch_xla has no sparse tensors (Embedding(sparse=True)'s backward raises)",
    ("grad", "sparse_bag"): "torch_xla has no sparse tensors (EmbeddingBag(sparse=True)'s backward raises)",
    ("graph", "checkpoint_nonreentrant"): "torch 2.9's non-reentrant checkpoint has no XLA device module "
                                          "and torch_xla's checkpoint is reentrant only",
}
#: Loop values a runtime whose graphs are compiled (XLA) cannot run, with the reason: never
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
    ("static_graph", "dataclass_output"): "torch's DDP with static_graph=True never all-reduces the first "
                                          "iteration's gradients when the module returns a structure "
                                          "torch.utils._pytree does not enter (PYTREE_LEAF_OUTPUTS; silent; "
                                          "torch 2.13; docs/findings.md 25): parity.structured_output_static "
                                          "holds it",
}
#: Workload dtypes drawn with short runs only (1..8 steps).
SHORT_RUN_DTYPES = ("bfloat16",)
#: Optimizers that take sparse gradients (torch's Adam/AdamW raise on them: SparseAdam is another one).
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

