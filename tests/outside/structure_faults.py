"""Faulty data-parallel wrappers, each the control (structure_control.DDP) with one realistic slip that only
bites on one kind of model structure.  Every class is identical to the control - and so to
torch's DDP - on plain MLPs and ordinary training; see each docstring.  structure_demo.py shows the
deviation from torch.nn.parallel.DistributedDataParallel (2 processes, gloo)."""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parameter import UninitializedParameter, UninitializedBuffer

from tests.outside.structure_control import DDP


def _walk(module, visit):
    """Parameters in named_parameters() order, through a visitor over (module, _parameters)."""
    seen, out = set(), []
    for m in module.modules():
        for p in visit(m):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class UnrunSubmoduleDDP(DDP):
    """Fault: a parameter takes part in the gradient reduction only if the submodule that owns it
    was *called as a module* (its forward pre-hook fired) since the last sync - the way
    hook-driven engines (ZeRO-3 / FSDP-style gather and reduce per submodule) decide what a
    forward touched.  Participation is agreed over all ranks (no hang), but a parameter whose
    owner is used functionally by its parent keeps its local gradient.

    Situation: nn.MultiheadAttention (and every nn.TransformerEncoder/DecoderLayer) reads
    `out_proj.weight` / `out_proj.bias` inside F.multi_head_attention_forward and never calls
    `out_proj(...)`; so do user modules that do `F.linear(x, self.proj.weight)`.
    Source: https://github.com/pytorch/pytorch/issues/78109 ("hooks on
    MultiheadAttention.out_proj are never called"); same shape as DeepSpeed ZeRO-3's "external
    parameters".
    Ordinary use passes: in an MLP (Sequential of Linear/activations) every parameter-owning
    module is called; containers without a forward (ParameterList/Dict, ModuleList) are
    attributed to their parent.
    """

    def __init__(self, module, **kw):
        super().__init__(module, **kw)
        owner_of = {}
        parent = {}
        for name, m in self.module.named_modules():
            for cname, c in m.named_children():
                parent.setdefault(id(c), m)
            for p in m._parameters.values():
                if p is not None:
                    owner_of.setdefault(id(p), m)
        self._owner = []
        for p in self._params:
            m = owner_of[id(p)]
            while type(m).forward is nn.Module.forward and id(m) in parent:
                m = parent[id(m)]
            self._owner.append(id(m))
        self._ran = set()
        self._skip = set()

    def _call_module(self, inputs, kwargs):
        ran = self._ran
        h = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda m, args: ran.add(id(m)))
        try:
            return self.module(*inputs, **kwargs)
        finally:
            h.remove()

    def _reduce(self):
        ran = torch.tensor([1 if o in self._ran else 0 for o in self._owner], dtype=torch.int32)
        dist.all_reduce(ran, group=self.process_group)
        self._skip = {i for i in range(len(self._params)) if ran[i].item() == 0}
        self._ran = set()
        super()._reduce()

    def _grads_for_reduction(self):
        return [i for i in range(len(self._params)) if i not in self._skip]


class RootParamsDDP(DDP):
    """Fault: the parameter walk goes over the model's layers, taken as
    `list(module.children()) or [module]` (a bare layer is its own single layer), so parameters
    registered directly on a wrapped module that *also has children* are neither broadcast at
    construction nor reduced.

    Situation: a ViT's `cls_token` / `pos_embed`, CLIP's `logit_scale`, a learned temperature or
    a gating scalar held by the top-level model (`self.x = nn.Parameter(...)` on the root next
    to its submodules).
    Source: https://github.com/openai/CLIP/issues/111 (CLIP's `logit_scale`, "a single-element
    nn.Parameter inside the module that DDP receives").
    Ordinary use passes: an MLP (nn.Sequential or a Module holding Linear layers) owns no
    parameter of its own and a bare nn.Linear is its own layer; every parameter is reached, in
    named_parameters() order.
    (First version, measured too: `for c in module.children()` only - it also dropped a bare
    layer's parameters and was caught by parity.linear, whose model is a bare nn.Linear.)
    """

    def _layer_params(self):
        seen, out = set(), []
        for layer in list(self.module.children()) or [self.module]:
            for p in layer.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _collect_params(self):
        return [p for p in self._layer_params() if p.requires_grad]

    def _sync_params(self):
        return self._layer_params()


class RootParamsChildrenOnlyDDP(RootParamsDDP):
    """First version of RootParamsDDP (kept for the record): the walk is
    `module.children()` only, so a bare layer wrapped directly loses its parameters too."""

    def _layer_params(self):
        seen, out = set(), []
        for layer in self.module.children():
            for p in layer.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out


class NonePositionalDDP(DDP):
    """Fault: the wrapper's input preparation (moving inputs to the device) rebuilds the
    positional arguments from the tensors it finds and drops the `None`s, so later positional
    arguments shift left into the wrong parameters of the user's forward.

    Situation: a multi-input forward called with a positional `None` for an optional input,
    e.g. `model(x, None, shift)` for `forward(self, x, mask=None, shift=None)` (HF-style
    `model(input_ids, None, token_type_ids)`, attention masks left out on some batches).
    Source: https://github.com/pytorch/pytorch/issues/33185 (the data-parallel input scatter
    misaligning positional inputs and keyword arguments of a multi-input forward).
    Ordinary use passes: `model(x)` or any call without a positional None is untouched.
    """

    def _call_module(self, inputs, kwargs):
        inputs = tuple(x for x in inputs if x is not None)
        return self.module(*inputs, **kwargs)


class StorageDedupDDP(DDP):
    """Fault: tied weights are detected by *storage* (untyped_storage().data_ptr()), not by
    tensor identity; only the first parameter of a storage is broadcast and reduced, the others
    are treated as aliases of it and keep their local values and gradients.

    Situation: distinct parameters that are views into one storage - q/k/v weights loaded with
    `load_state_dict(..., assign=True)` from a checkpoint whose fused qkv tensor was split with
    `.chunk(3)` (torch.load / safetensors keep the views), or weights created as slices of one
    initialised block.
    Sources: https://github.com/safetensors/safetensors/pull/379 (views sharing one storage
    detected as duplicates) and the same storage-pointer dedup reviewed in
    https://github.com/NVIDIA/TensorRT-LLM/pull/13926 .
    Ordinary use passes: every parameter built by nn.Linear etc. owns its storage; truly tied
    parameters (one object) are deduplicated exactly as before.
    """

    def _dedup(self, params):
        seen, out = set(), []
        for p in params:
            key = p.untyped_storage().data_ptr()
            if key in seen:
                continue
            seen.add(key)
            out.append(p)
        return out

    def _collect_params(self):
        return [p for p in self._dedup(list(self.module.parameters())) if p.requires_grad]

    def _sync_params(self):
        return self._dedup(list(self.module.parameters()))


class BigParamDDP(DDP):
    """Fault: gradients go through a fixed fusion buffer of 25 MiB per tensor (torch's default
    bucket_cap_mb); a gradient larger than the buffer is copied in truncated, so only its first
    25 MiB are averaged and the tail keeps each replica's local gradient.

    Situation: one parameter bigger than the bucket - a vocabulary embedding or output head
    (e.g. 50k x 128 float32 = 25.6 MB, 32k x 4096 in LLMs).
    Source: https://github.com/deepspeedai/DeepSpeed/pull/3832 ("grad tensors that don't fit in
    the bucket flat buffer are not added to it", allreduce assumed all grads are in the buffer).
    Ordinary use passes: every MLP / test-size parameter is far below 25 MiB.
    """

    CAP_BYTES = 25 * 1024 * 1024

    def _span(self, p):
        return min(p.numel(), self.CAP_BYTES // p.element_size())


class LazyParamsDDP(DDP):
    """Fault: parameters still uninitialised at wrap time (lazy modules) are skipped instead of
    refused: they are materialised by each replica's first forward with its own random init,
    never broadcast and never reduced - replicas train different weights with no error.
    torch's DDP raises "Modules with uninitialized parameters can't be used with
    DistributedDataParallel. Run a dummy forward pass to correctly initialize the modules".

    Situation: nn.LazyLinear / LazyConv* (and PyG's lazy layers) wrapped before a dry-run
    forward.  Source: https://github.com/pyg-team/pytorch_geometric/issues/9692 (and
    https://github.com/bghira/SimpleTuner/issues/686).
    Ordinary use passes: without lazy modules (or after the dry run) nothing is skipped.
    """

    def _collect_params(self):
        return [p for p in self.module.parameters()
                if p.requires_grad and not isinstance(p, UninitializedParameter)]

    def _sync_params(self):
        return [p for p in self.module.parameters() if not isinstance(p, UninitializedParameter)]

    def _buffers_to_sync(self):
        return [b for b in self.module.buffers() if not isinstance(b, UninitializedBuffer)]


class NoneSlotDDP(DDP):
    """Fault: the per-module parameter walk (module._parameters) stops at the first `None`
    slot (`break` where `continue` was meant), so a module that registers an optional
    parameter as None *before* real ones loses the later ones: they are neither broadcast nor
    reduced.

    Situation: nn.MultiheadAttention registers `q_proj_weight`/`k_proj_weight`/`v_proj_weight`
    as None (packed `in_proj_weight`), or `in_proj_weight` as None (kdim/vdim != embed_dim),
    *before* `in_proj_bias`: `in_proj_bias` goes unsynchronised in every nn.Transformer* layer.
    Source: https://github.com/pytorch/pytorch/issues/26698 (MultiheadAttention and DDP: its
    None / q,k,v-proj parameter registration breaking DDP).
    Ordinary use passes: Linear/Conv with bias=False register the None last; MLPs have none.
    """

    def _visit(self, m):
        out = []
        for name, p in m._parameters.items():
            if p is None:
                break
            out.append(p)
        return out

    def _collect_params(self):
        return [p for p in _walk(self.module, self._visit) if p.requires_grad]

    def _sync_params(self):
        return _walk(self.module, self._visit)


class NestedBuffersDDP(DDP):
    """Fault: buffers are gathered from the wrapped module and its direct children only
    (`child.named_buffers(recurse=False)`), so buffers two or more levels down - BatchNorm
    running statistics inside a residual block, a RoPE cache inside an attention submodule -
    are never broadcast; each replica keeps its own.

    Situation: a BatchNorm (or any buffer) nested in a block inside the wrapped model, e.g.
    torchvision ResNet `layer1.0.bn1`.
    Source: https://github.com/facebookresearch/moco/issues/41 (running statistics of vanilla
    BN in nested encoder blocks under DDP: they rely on DDP's buffer broadcast).
    Ordinary use passes: a plain MLP has no buffers; a flat nn.Sequential's BatchNorm is a
    direct child and is still broadcast.
    """

    def _buffers_to_sync(self):
        out = list(self.module.buffers(recurse=False))
        for c in self.module.children():
            out.extend(c.buffers(recurse=False))
        return out
