"""Process-wide state a DDP can leave changed in a replica's process, kept from reaching the next
implementation that runs in the same world (docs/isolation.md).

:data:`INVENTORY` lists it, one :class:`Item` per kind of state: what is read, in which scope (the
process, or each replica's thread: PJRT replicas are threads of one process), how a change reads
in a verdict, and how it is put back - or why it cannot be, and the world is then started anew.
A world's host takes :func:`take_snapshot` once its runtime is ready; :func:`changes` is what
differs from it now (the transparency oracle names these on the case that made them);
:func:`restore` (the world task :func:`restore_task`) puts the snapshot back, once per
implementation per world, before another implementation's first task. The process-wide torch
settings (default dtype, grad mode, ...) are put back after every task by
:func:`conformance.worlds.runtimes.base.run_task` and are not repeated here.

torch's ``DistributedDataParallel`` changes none of this (measured: docs/isolation.md), so every
change is the implementation's. This module imports torch only inside its functions.
"""
from __future__ import annotations

import dataclasses
import os
import random
import sys
import threading
import types
from typing import Any, Callable

#: Namespaces whose functions a DDP may replace at run time (``dist.all_reduce = wrapped``):
#: ``(module or class path, attribute holding it)``; those not importable when the snapshot is
#: taken are left out (torch_xla on the CPU runtime).
FUNCTION_NAMESPACES = ("torch", "torch.nn.functional", "torch.distributed", "torch.distributed.distributed_c10d",
                       "torch.autograd", "torch.Tensor", "torch.nn.Module", "torch.optim.Optimizer",
                       "torch_xla", "torch_xla.core.xla_model", "torch_xla.runtime")
#: Process-wide hook dictionaries of torch (``register_module_forward_hook``,
#: ``register_optimizer_step_pre_hook``, ...): ``(module, attribute)``.
GLOBAL_HOOKS = tuple(("torch.nn.modules.module", f"_global_{n}") for n in (
    "forward_pre_hooks", "forward_hooks", "forward_hooks_with_kwargs", "forward_hooks_always_called",
    "backward_pre_hooks", "backward_hooks", "module_registration_hooks", "parameter_registration_hooks",
    "buffer_registration_hooks")) + (("torch.optim.optimizer", "_global_optimizer_pre_hooks"),
                                     ("torch.optim.optimizer", "_global_optimizer_post_hooks"))
#: Registries of ``torch.distributed.Backend`` a ``register_backend`` call adds to.
BACKEND_REGISTRIES = ("_plugins", "backend_capability", "backend_type_map", "default_device_backend_map")
#: Device types whose autocast state is read.
AUTOCAST_DEVICES = ("cpu", "xla")


@dataclasses.dataclass(frozen=True)
class Item:
    """One kind of process-wide state.

    Attributes:
        name: what the docs and :data:`INVENTORY` call it.
        scope: ``"process"`` or ``"thread"`` (read and put back in each replica's thread).
        read: ``() -> value``; compared with ``==`` (what is kept must stay comparable).
        differences: ``(saved, now) -> [sentence, ...]``, each naming what changed.
        restore: ``(saved) -> None`` puts ``saved`` back; ``None`` when it cannot be done in place.
        fresh: why a change needs a fresh world (``restore`` is None, or refuses a change).
        judged: a change is a failing transparency verdict (the generators are put back only:
            every case draws from them).
        checks_itself: the snapshot's value compares itself with the live state (``differences``
            gets ``now=None``): the function table, too costly to read again at every check.
    """

    name: str
    scope: str
    read: Callable[[], Any]
    differences: Callable[[Any, Any], list]
    restore: Callable[[Any], None] | None
    fresh: str = ""
    judged: bool = True
    checks_itself: bool = False

    def changed(self, saved) -> list:
        """Sentences naming what differs from ``saved`` now (``[]``: nothing)."""
        if self.checks_itself:
            return self.differences(saved, None)
        now = self.read()
        return [] if now == saved else self.differences(saved, now)


class NeedsFreshWorld(Exception):
    """A change that cannot be put back in this process; the message says what and why."""


# --- torch.distributed ------------------------------------------------------------------------

def _group():
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return None
    pg = dist.distributed_c10d._get_default_group()
    return (id(pg), str(dist.get_backend()), dist.get_rank(), dist.get_world_size())


def _group_text(g) -> str:
    return "not initialised" if g is None else f"backend {g[1]}, rank {g[2]}, world_size {g[3]}"


def _group_differences(saved, now) -> list:
    if saved == now:
        return []
    if saved is None:
        return [f"torch.distributed initialised ({_group_text(now)})"]
    if now is None:
        return ["torch.distributed's default group destroyed"]
    return [f"torch.distributed's default group replaced ({_group_text(now)}; was {_group_text(saved)})"]


def _restore_group(saved) -> None:
    import torch.distributed as dist
    if saved is None:
        dist.destroy_process_group()
        return
    raise NeedsFreshWorld("the world's torch.distributed default group was destroyed or replaced: its peers "
                          "rendezvous anew only with a new world")


def _backends():
    """The registry ``torch.distributed.Backend.register_backend`` writes, as copies."""
    import torch.distributed as dist
    b = dist.Backend
    return (tuple(b.backend_list), {n: getattr(b, n) for n in vars(b) if n.isupper() and isinstance(getattr(b, n), str)},
            *({k: (list(v) if isinstance(v, list) else v) for k, v in getattr(b, r).items()} for r in BACKEND_REGISTRIES))


def _backend_differences(saved, now) -> list:
    out = ([f"torch.distributed backend {n!r} registered" for n in now[0] if n not in saved[0]]
           + [f"torch.distributed backend {n!r} removed" for n in saved[0] if n not in now[0]])
    return out or ["torch.distributed's backend registry changed"]


def _restore_backends(saved) -> None:
    import torch.distributed as dist
    b = dist.Backend
    b.backend_list[:] = saved[0]
    for n in [n for n in vars(b) if n.isupper() and isinstance(getattr(b, n), str) and n not in saved[1]]:
        delattr(b, n)
    for n, v in saved[1].items():
        setattr(b, n, v)
    for reg, kept in zip(BACKEND_REGISTRIES, saved[2:]):
        live = getattr(b, reg)
        live.clear()
        live.update(kept)


# --- environment, working directory -----------------------------------------------------------

def _environment() -> dict:
    return dict(os.environ)


#: Variables torch's compiler writes for its own workers when a graph is compiled
#: (torch/_inductor: runtime/cache_dir_utils.py, async_compile.py, codecache.py, cpp_builder.py):
#: put back like any variable, but torch's doing, not the implementation's.
COMPILER_VARIABLES = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TORCH_WARM_POOL", "KMP_DUPLICATE_LIB_OK",
                                "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"})


def _environment_differences(saved, now) -> list:
    out = []
    for k in sorted((saved.keys() | now.keys()) - COMPILER_VARIABLES):
        if k not in now:
            out.append(f"environment variable {k} removed (was {saved[k]!r})")
        elif k not in saved:
            out.append(f"environment variable {k} set to {now[k]!r}")
        elif saved[k] != now[k]:
            out.append(f"environment variable {k} is {now[k]!r} (was {saved[k]!r})")
    return out


def _restore_environment(saved) -> None:
    for k in [k for k in os.environ if k not in saved]:
        del os.environ[k]
    for k, v in saved.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


# --- functions replaced, global hooks ---------------------------------------------------------

def _namespace(path: str):
    """The loaded module ``path``, or the class ``path`` names in a loaded module; ``None`` otherwise."""
    if path in sys.modules:
        return sys.modules[path]
    head, _, attr = path.rpartition(".")
    return getattr(sys.modules[head], attr, None) if head in sys.modules else None


class _Functions:
    """The callables of :data:`FUNCTION_NAMESPACES` when the snapshot was taken, checked by
    identity (one dictionary lookup per function)."""

    def __init__(self):
        self.tables = []
        for path in FUNCTION_NAMESPACES:
            ns = _namespace(path)
            if ns is not None:
                d = vars(ns)
                self.tables.append((path, ns, d, tuple((k, v) for k, v in d.items() if callable(v)
                                                      and not isinstance(v, (type, types.ModuleType)))))

    def replaced(self) -> list:
        """``[(path, namespace, name, original), ...]`` of every function that is not the original now."""
        return [(path, ns, k, v) for path, ns, d, kept in self.tables for k, v in kept if d.get(k) is not v]

    def differences(self) -> list:
        return [f"{path}.{k} {'replaced' if k in vars(ns) else 'deleted'}" for path, ns, k, _ in self.replaced()]

    def restore(self) -> None:
        for _, ns, k, v in self.replaced():
            setattr(ns, k, v)


def _hooks():
    return {f"{m}.{a}": dict(getattr(sys.modules[m], a)) for m, a in GLOBAL_HOOKS
            if m in sys.modules and hasattr(sys.modules[m], a)}


def _hook_differences(saved, now) -> list:
    out = []
    for name, hooks in now.items():
        added = len(hooks.keys() - saved.get(name, {}).keys())
        gone = len(saved.get(name, {}).keys() - hooks.keys())
        if added:
            out.append(f"{added} hook(s) registered in {name}")
        if gone:
            out.append(f"{gone} hook(s) removed from {name}")
    return out


def _restore_hooks(saved) -> None:
    for name, hooks in saved.items():
        m, _, a = name.rpartition(".")
        live = getattr(sys.modules[m], a)
        for k in [k for k in live if k not in hooks]:
            del live[k]
        live.update(hooks)


# --- torch_xla --------------------------------------------------------------------------------

def _spmd():
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla.runtime as xr
    return bool(xr.is_spmd())


def _spmd_differences(saved, now) -> list:
    return [] if saved == now else [f"torch_xla's SPMD mode {'on' if now else 'off'} (was {'on' if saved else 'off'})"]


def _xla_device():
    if "torch_xla" not in sys.modules:
        return None
    return str(sys.modules["torch_xla"]._XLAC._xla_get_default_device())


def _restore_xla_device(saved) -> None:
    import torch_xla
    torch_xla._XLAC._xla_set_default_device(saved)


# --- thread-local modes -----------------------------------------------------------------------

def _modes():
    import torch
    out = {"autocast cache": torch.is_autocast_cache_enabled(), "inference mode": torch.is_inference_mode_enabled(),
           "torch function modes": torch._C._len_torch_function_stack(),
           "dispatch modes": torch._C._len_torch_dispatch_stack(), "default device": _default_device()}
    for dev in AUTOCAST_DEVICES:
        try:
            out[f"autocast on {dev}"] = (f"on ({str(torch.get_autocast_dtype(dev)).removeprefix('torch.')})"
                                         if torch.is_autocast_enabled(dev) else "off")
        except RuntimeError:  # a device type this build does not know
            pass
    return out


def _mode_differences(saved, now) -> list:
    return [f"{k} is {now.get(k)} (was {v})" for k, v in saved.items() if now.get(k) != v]


def _default_device() -> str:
    import torch
    try:
        return str(torch.get_default_device())
    except AttributeError:  # torch 2.9 after set_default_device(None): no device context left
        return "cpu"


def _restore_modes(saved) -> None:
    """Only what differs: ``set_default_device`` pushes a mode of its own."""
    import torch
    from torch.utils._python_dispatch import _pop_mode
    now = _modes()
    if now["inference mode"] != saved["inference mode"]:
        raise NeedsFreshWorld("inference mode left entered in a replica's thread cannot be left from outside it")
    if now["default device"] != saved["default device"]:
        torch.set_default_device(None if saved["default device"] == "cpu" else saved["default device"])
    while torch._C._len_torch_function_stack() > saved["torch function modes"]:
        torch._C._pop_torch_function_stack()
    while torch._C._len_torch_dispatch_stack() > saved["dispatch modes"]:
        _pop_mode()
    if now["autocast cache"] != saved["autocast cache"]:
        torch.set_autocast_cache_enabled(saved["autocast cache"])
    for dev in AUTOCAST_DEVICES:
        key = f"autocast on {dev}"
        if key in saved and now.get(key) != saved[key]:
            torch.set_autocast_enabled(dev, saved[key] != "off")
            if saved[key] != "off":
                torch.set_autocast_dtype(dev, getattr(torch, saved[key][4:-1]))


# --- generators -------------------------------------------------------------------------------

def _generators():
    import numpy
    import torch
    return _Opaque((torch.get_rng_state(), random.getstate(), numpy.random.get_state()))


def _restore_generators(saved) -> None:
    import numpy
    import torch
    cpu, py, np_state = saved.value
    torch.set_rng_state(cpu)
    random.setstate(py)
    numpy.random.set_state(np_state)


def _xla_generator():
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla.core.xla_model as xm
    return xm.get_rng_state()


def _restore_xla_generator(saved) -> None:
    import torch_xla.core.xla_model as xm
    xm.set_rng_state(saved)


@dataclasses.dataclass(eq=False)
class _Opaque:
    """A state that is put back, never compared (every case draws from it)."""
    value: Any

    def __eq__(self, other):
        return True


def _none(saved, now) -> list:
    return []


#: The inventory item of the default group (a world reset replaces it: :func:`retake`).
GROUP_ITEM = "torch.distributed default group"
#: The inventory, in the order a verdict names changes. The generators are last: put back, not judged.
INVENTORY = (
    Item(GROUP_ITEM, "process", _group, _group_differences, _restore_group,
         "a default group destroyed or replaced: the world's peers rendezvous anew only in a new world"),
    Item("torch.distributed backends", "process", _backends, _backend_differences, _restore_backends,
         "a backend of the snapshot removed from the registry"),
    Item("environment variables", "process", _environment, _environment_differences,
         _restore_environment),
    Item("working directory", "process", os.getcwd,
         lambda s, n: [] if s == n else [f"working directory is {n} (was {s})"], os.chdir),
    Item("functions of torch, torch.distributed and torch_xla", "process", _Functions,
         lambda saved, now: saved.differences(), lambda saved: saved.restore(), checks_itself=True),
    Item("global module and optimizer hooks", "process", _hooks, _hook_differences, _restore_hooks),
    Item("torch_xla SPMD mode", "process", _spmd, _spmd_differences, None,
         "use_spmd() moves the process's tensors to a virtual device, which cannot be undone"),
    Item("autocast, inference mode, torch function and dispatch modes, default device", "thread", _modes,
         _mode_differences, _restore_modes, "inference mode left entered in a replica's thread"),
    Item("XLA default device", "thread", _xla_device,
         lambda s, n: [] if s == n else [f"the replica thread's XLA device is {n} (was {s})"], _restore_xla_device),
    Item("default generators (torch CPU, random, numpy)", "process", _generators, _none, _restore_generators,
         judged=False),
    Item("XLA device generator", "thread", _xla_generator, _none, _restore_xla_generator, judged=False),
)

_LOCK = threading.Lock()
_SNAPSHOT: dict = {}  # "process" -> {item name: value}; thread ident -> {item name: value}


def take_snapshot(scope: str = "process") -> None:
    """Record the items of ``scope`` as they are now: ``"process"`` once per host process when its
    runtime is ready, ``"thread"`` in each replica thread before its first task."""
    with _LOCK:
        key = "process" if scope == "process" else threading.get_ident()
        _SNAPSHOT[key] = {i.name: i.read() for i in INVENTORY if i.scope == scope}


def retake(*names: str) -> None:
    """Record again the process items ``names`` (:data:`INVENTORY` names): the kit changed them
    itself (a world reset rendezvouses a new default group), so no implementation is judged for it.

    Raises:
        KeyError: a name that is not a process item of the inventory."""
    items = {i.name: i for i in INVENTORY if i.scope == "process"}
    with _LOCK:
        if "process" in _SNAPSHOT:
            for n in names:
                _SNAPSHOT["process"][n] = items[n].read()


def thread_snapshot() -> dict:
    """This thread's snapshot, taken now if it has none (a replica thread's first task)."""
    ident = threading.get_ident()
    if ident not in _SNAPSHOT:
        take_snapshot("thread")
    return _SNAPSHOT[ident]


def snapshot_taken() -> bool:
    """A world's host took its snapshot in this process (unit tests of the oracle take none)."""
    return "process" in _SNAPSHOT


def changes() -> list[str]:
    """What differs from the snapshot now, one sentence per change of a judged item (``[]``:
    nothing, or no snapshot was taken in this process)."""
    if not snapshot_taken():
        return []
    out = []
    thread = thread_snapshot()
    for item in INVENTORY:
        if not item.judged:
            continue
        out += item.changed((_SNAPSHOT["process"] if item.scope == "process" else thread)[item.name])
    return out


def restore(scope: str) -> dict:
    """Put the snapshot of ``scope`` back: ``{"restored": [sentences of what was changed],
    "fresh": [why a fresh world is needed]}`` (``fresh`` empty: the state is the snapshot's)."""
    if not snapshot_taken():
        return {"restored": [], "fresh": []}
    saved_all = _SNAPSHOT["process"] if scope == "process" else thread_snapshot()
    restored, fresh = [], []
    for item in INVENTORY:
        if item.scope != scope:
            continue
        saved = saved_all[item.name]
        said = item.changed(saved)
        if not said and (item.judged or saved is None):  # None: not in this process (torch_xla)
            continue
        try:
            if item.restore is None:
                raise NeedsFreshWorld(f"{'; '.join(said)}: {item.fresh}")
            item.restore(saved)
        except NeedsFreshWorld as exc:
            fresh.append(str(exc))
            continue
        except Exception as exc:  # noqa: BLE001 - a state that does not go back: the world is replaced
            fresh.append(f"{'; '.join(said) or item.name}: putting it back raised {type(exc).__name__}: {exc}")
            continue
        restored += said
    return {"restored": restored, "fresh": fresh}


def restore_task(ctx) -> dict:
    """World task: put back every item (the process's once per process, under a lock; each replica
    thread's own): ``{"restored": [...], "fresh": [...]}`` for this replica."""
    with _LOCK:
        process = restore("process")
    thread = restore("thread")
    return {"restored": process["restored"] + thread["restored"], "fresh": process["fresh"] + thread["fresh"]}
