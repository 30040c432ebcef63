"""Reading a replica's state back to the host (a leaf module: the training loop,
the setups and the scenario task all use it)."""
from __future__ import annotations

import numpy as np
import copy
import hashlib
import io


def full(t):
    """``t`` as a full tensor: a DTensor shard (FSDP2) is gathered with
    ``full_tensor()`` - a collective, so every replica must read the same tensors."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def on_host(tensors) -> list:
    """``tensors`` (detached) copied to the host, in order. Tensors on an XLA device are copied
    in one transfer (``torch_xla``'s batched device-to-host copy, as ``xm.save`` uses): a
    per-tensor ``.cpu()`` is one transfer each, for every parameter and state after every step."""
    out = list(tensors)
    on_xla = [i for i, t in enumerate(out) if t.device.type == "xla"]
    if on_xla:
        from ddp_impl.runtime.xla import to_host
        for i, t in zip(on_xla, to_host([out[i] for i in on_xla])):
            out[i] = t
    return [t.cpu() for t in out]  # the rest (a no-op for the copies)


def flat_params(module) -> np.ndarray:
    """All parameters of ``module`` concatenated, float32 ``[P]`` on the host (float64 when one is
    float64 or complex128), full tensors (a DTensor shard gathered) in ``parameters()`` order, each
    in logical order whatever its strides, a complex one as ``view_as_real`` pairs."""
    import torch
    ps = on_host(full(p).detach() for p in module.parameters())
    wide = any(p.dtype in (torch.float64, torch.complex128) for p in ps)
    # .cpu() first: on XLA a dtype cast would be a device graph compiled per read.
    ps = [torch.view_as_real(p) if p.is_complex() else p for p in ps]
    return torch.cat([p.to(torch.float64 if wide else torch.float32).reshape(-1) for p in ps]).numpy()


def corner(p, sparse_grad: bool = False) -> str:
    """The workload corner of parameter ``p``, as a verdict shows it after the name (``""``
    for a dense, contiguous float32 one): its dtype if not float32, ``channels_last`` or
    ``non-contiguous`` if so, ``sparse gradient`` when ``sparse_grad``; e.g. ``complex64``."""
    import torch
    parts = [] if p.dtype == torch.float32 else [str(p.dtype).replace("torch.", "")]
    if p.dim() == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last):
        parts.append("channels_last")
    elif not p.is_contiguous():
        parts.append("non-contiguous")
    if sparse_grad:
        parts.append("sparse gradient")
    return ", ".join(parts)


def param_layout(module) -> list:
    """``[(name, shape), ...]`` of :func:`flat_params`' tensors, in its order (a DTensor's global
    shape: no collective; a complex one's ends in 2); a parameter in a workload corner
    (:func:`corner`) is ``(name, shape, corner)``. Verdicts name tensors with it."""
    import torch
    # parameters whose gradient is sparse, known from the module before any backward
    sparse = {id(m.weight) for m in module.modules()
              if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse}
    held = _held_in(module)
    out = []
    for n, p in module.named_parameters():
        c = ", ".join(x for x in (corner(p, id(p) in sparse), held.get(n, "")) if x)
        shape = tuple(p.shape) + ((2,) if p.is_complex() else ())
        out.append((n, shape, c) if c else (n, shape))
    return out


def _held_in(module) -> dict:
    """``{parameter name: what holds it}`` for the module dimensions a verdict names: a parameter
    of an ``nn.ParameterList`` / ``nn.ParameterDict``, a parametrization's original tensor."""
    from torch import nn
    out = {}
    for mn, m in module.named_modules():
        kind = ("in an nn.ParameterList" if isinstance(m, nn.ParameterList) else
                "in an nn.ParameterDict" if isinstance(m, nn.ParameterDict) else "")
        for pn, _ in m.named_parameters(recurse=False):
            name = f"{mn}.{pn}" if mn else pn
            if kind:
                out[name] = kind
            elif ".parametrizations." in f".{name}" and pn == "original":
                out[name] = "a parametrization's original"
    return out


def buffer_layout(module) -> list:
    """``[(name, shape), ...]`` of :func:`flat_buffers`' tensors, in its order; a buffer
    registered ``persistent=False`` (absent from ``state_dict()``) or not float32 is
    ``(name, shape, "non-persistent buffer, int64")``: verdicts name it so."""
    out, seen = [], set()
    for mn, m in module.named_modules():
        for bn, b in m.named_buffers(recurse=False):
            if b is None or id(b) in seen:  # named_buffers() lists a shared buffer once
                continue
            seen.add(id(b))
            parts = (["non-persistent buffer"] if bn in m._non_persistent_buffers_set else []) + (
                [str(b.dtype).replace("torch.", "")] if str(b.dtype) != "torch.float32" else [])
            name = f"{mn}.{bn}" if mn else bn
            out.append((name, tuple(b.shape), ", ".join(parts)) if parts else (name, tuple(b.shape)))
    return out


def flat_buffers(module) -> np.ndarray:
    """All buffers of ``module`` concatenated as float64 ``[B]`` (``[0]`` when none)."""
    import torch
    bufs = [b.double().reshape(-1) for b in on_host(b.detach() for b in module.buffers())]
    return torch.cat(bufs).numpy() if bufs else np.zeros(0)


def to_device(module, device):
    """``module.to(device)``, keeping tied (shared) parameters tied: moving to an XLA device gives
    every module its own new Parameter (the CPU and XLA tensors are not shallow-copy compatible),
    so a weight shared by two modules becomes two (torch_xla 2.9)."""
    ties = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        for name, p in mod._parameters.items():
            if p is not None:
                ties.setdefault(id(p), []).append((mod_name, name))
    module = module.to(device)
    mods = dict(module.named_modules(remove_duplicate=False))
    for (m0, n0), *rest in ties.values():
        for m, n in rest:
            mods[m]._parameters[n] = mods[m0]._parameters[n0]
    return module


def to_cpu(obj):
    """``obj`` (nested dicts/lists of tensors) with every tensor copied to the host,
    as ``torch_xla``'s ``xm.save`` does before saving: XLA-device storages cannot
    be restored by ``torch.load``."""
    import torch
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        out = copy.copy(obj)  # same type and attributes (a state_dict's _metadata)
        for k, v in obj.items():
            out[k] = to_cpu(v)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def flat_optimizer_state(opt, state_dict=None) -> np.ndarray:
    """Every tensor of the optimizer state (e.g. momentum buffers) concatenated, float64 (sharded
    ones gathered, sparse ones dense, complex ones as ``view_as_real`` pairs); from
    ``state_dict["state"]`` (per parameter index) when a full state dict is given."""
    import torch
    states = opt.state.values() if state_dict is None else [
        state_dict["state"][k] for k in sorted(state_dict["state"])]
    # A sparse state (SGD's momentum of a sparse gradient) is read dense: the same values;
    # a complex one as real/imaginary pairs (a cast to float64 would drop the imaginary part).
    ts = [_dense(v).double().reshape(-1) for v in on_host(full(v).detach() for st in states
                                                           for v in st.values() if torch.is_tensor(v) and v.dim() > 0)]
    return torch.cat(ts).numpy() if ts else np.zeros(0)


def _dense(t):
    """``t`` as a dense real tensor: sparse densified, complex as (real, imaginary) pairs."""
    import torch
    t = t.to_dense() if t.is_sparse else t
    return torch.view_as_real(t) if t.is_complex() else t


def optimizer_state_layout(opt, state_dict=None, module=None) -> list:
    """``[(name, shape), ...]`` of :func:`flat_optimizer_state`'s tensors, in its
    order: ``state[<key>].<entry>`` (the state_dict's key: the parameter's index in
    ``param_groups``, or its name), plus the parameter's name in ``module`` where
    the index resolves to a parameter of that shape, e.g. ``state[1].momentum_buffer (bias)``."""
    import torch
    params = [p for g in getattr(opt, "param_groups", []) for p in g["params"]]
    names = {id(p): n for n, p in module.named_parameters()} if module is not None else {}
    if state_dict is None:
        index = {id(p): i for i, p in enumerate(params)}
        items = [(index.get(id(p), "?"), st) for p, st in opt.state.items()]
    else:
        items = [(k, state_dict["state"][k]) for k in sorted(state_dict["state"])]
    out = []
    for key, st in items:
        p = params[key] if isinstance(key, int) and 0 <= key < len(params) else None
        for entry, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0:
                who = names.get(id(p)) if p is not None and tuple(p.shape) == tuple(v.shape) else None
                out.append((f"state[{key}].{entry}" + (f" ({who})" if who else ""),
                            tuple(v.shape) + ((2,) if v.is_complex() else ())))
    return out


def optimizer_state_dict(impl, opt, ctx) -> dict:
    """The optimizer's full state dict (``Strategy.optimizer_state_dict`` for sharded ones)."""
    return impl.optimizer_state_dict(opt, ctx) if impl.optimizer_state_dict else opt.state_dict()


def state_digest(*arrays) -> str:
    """SHA-1 of the bytes of ``arrays`` (replica agreement compares bits, cheaply)."""
    h = hashlib.sha1()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def saved_copy(obj):
    """What a checkpoint of ``obj`` gives back: ``torch.save`` of :func:`to_cpu` ``(obj)``
    into memory, then ``torch.load`` onto the CPU (``load_state_dict`` copies to the device)."""
    import torch
    blob = io.BytesIO()
    torch.save(to_cpu(obj), blob)
    blob.seek(0)
    return torch.load(blob, map_location="cpu")


def saved_checkpoint(model_state: dict, optim_state: dict) -> tuple[dict, dict]:
    """The kit's checkpoint: a model's and an optimizer's state dicts through :func:`saved_copy`,
    the DDP wrapper's ``module.`` prefix dropped from the model's keys, so both load into a
    replica rebuilt from other seeds (the train kind's checkpoint setups, the scenarios)."""
    import torch
    saved = saved_copy({"model": model_state, "optim": optim_state})
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(saved["model"], "module.")
    return saved["model"], saved["optim"]
