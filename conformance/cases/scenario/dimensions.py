"""The scenario's dimensions: each one's values (the first is the plain one Hypothesis shrinks
towards), how a verdict names them, what a runtime whose graphs are compiled (XLA) refuses and
what upstream DDP fails; the scenario model's sizes, output structures and data indices.

The JSON data that holds a choice of them, and its validation against these tables:
:mod:`.format`; the model they shape: :mod:`.model`. docs/scenarios.md describes each axis.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

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

#: The loop dimension (docs/scenarios.md, "The loop programs"): what a user's training
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
#: The module dimension drawn with the loop programs (docs/scenarios.md, "The module axis"): what the user's
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


#: A forward without backward (``step["eval"]``, keys :data:`~.format.EVAL_KEYS`): ``{"at": j,
#: "grad": ..., "mode": ..., "batch": [n per replica]}`` runs before micro-step ``j`` (``j`` = the
#: window's length: after the last backward, before the step) under ``grad`` with the module in
#: ``mode``, through the DDP, output discarded. In ``train`` mode it updates the buffers (a metric computed under ``no_grad`` in train
#: mode). ``grad`` ``enabled``: autograd on and no backward (validation written without
#: ``no_grad``); it runs outside ``no_sync()``, so DDP counts it as a synced training forward and
#: broadcasts buffers at the next forward; under ``no_grad`` / ``inference_mode`` it does not
#: (``_pre_forward``: ``require_forward_param_sync``). ``raising``: grad enabled, and the module
#: raises after its buffers moved (a bad batch found mid-forward, on every rank; the loop catches
#: it and goes on): torch sets the flag only after the module returns, so it keeps the previous
#: forward's, and the next forward broadcasts if that one was a synced training forward.
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

#: The workload dimension (docs/scenarios.md, "The workload axis"): what the scenario model's parameters
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
#: with the reason (docs/scenarios.md, PJRT): never drawn there; a replayed one is
#: ``unsupported``.
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

