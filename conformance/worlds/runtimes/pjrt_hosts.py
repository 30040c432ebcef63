"""Emulated hosts on the PJRT runtime: W replica threads of one process shown as H hosts.

On one host every local query of torch_xla equals its global one (all W replica threads are
addressable devices of one process), so a DDP that divides by ``xr.addressable_device_count()``
or shards by ``xm.get_local_ordinal()`` is exact there and wrong on a pod (pytorch/xla PR #4965
fixed one such divisor). XLA:CPU has no cross-process collectives (pytorch/xla#9089), so the host
boundary is emulated in the queries: each replica's device carries a :class:`HostLayout`, and
torch_xla 2.9's public per-host queries (:data:`QUERIES`: the layout field each answers) answer
from the layout of the device the calling thread works on, as a pod of H hosts x W/H devices,
one process per host, would (so ``xm.is_master_ordinal()`` and ``xm.master_print`` act once per
host). Global queries (``xr.world_size``, ``xr.global_ordinal``, ``xr.global_device_count``) and
the collectives are real and stay global, and so are the answers torch_xla's own callers that
need the one real process get (:data:`CALLERS` says which and why). Not emulated
(docs/multi-host.md says why): torch.distributed's ``xla`` group, environment variables, device
identity, the host's main thread (it works for no replica), and names bound with ``from
torch_xla.runtime import ...`` before :func:`install` (it replaces module attributes).

Keyed by device, not by thread (:func:`register`): in torch_xla 2.9 a backward on ``xla:i`` runs
its tensor hooks, post-accumulate-grad hooks and ``Variable._execution_engine.queue_callback``
callbacks on the autograd engine's device thread for ``xla:i`` (a ``Dummy-N`` thread;
torch/csrc/autograd/engine.cpp, one worker per non-CPU device), whose current device the device
guard has set to ``xla:i``. A thread that never chose a device works on torch_xla's default
``xla:0`` and answers as that replica's host.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
import threading

_thread = threading.local()
_INSTALL_LOCK = threading.Lock()
_ORIGINALS: dict = {}
# Device ordinal -> HostLayout of the replica on it (process-wide: every thread reads it).
_BY_DEVICE: dict = {}


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """Where one replica sits in an emulated pod (all ints).

    Attributes:
        host: host (= process) index h, 0 <= h < host_count.
        host_count: H.
        local_ordinal: index among its host's replicas, 0 <= l < local_device_count.
        local_device_count: replicas per host, W / H.
    """

    host: int
    host_count: int
    local_ordinal: int
    local_device_count: int

    @classmethod
    def of(cls, global_ordinal: int, world_size: int, hosts: int) -> "HostLayout":
        """Replica ``global_ordinal`` of ``world_size`` grouped into ``hosts`` contiguous hosts
        (torchrun's node layout: ordinals h*L .. h*L+L-1 on host h).

        Raises:
            ValueError: ``hosts`` does not divide ``world_size``, or the ordinal is outside it.
        """
        if hosts < 1 or world_size % hosts or not 0 <= global_ordinal < world_size:
            raise ValueError(f"no layout for replica {global_ordinal} of {world_size} on {hosts} host(s)")
        per_host = world_size // hosts
        return cls(global_ordinal // per_host, hosts, global_ordinal % per_host, per_host)


# (module, function) -> the layout field it answers (torch_xla 2.9). local_device_count
# is local_process_count() x addressable_device_count(); local_process_count is 1 here
# (PJRT_LOCAL_PROCESS_COUNT, one process per emulated host).
QUERIES = {
    ("torch_xla.runtime", "process_index"): "host",
    ("torch_xla.runtime", "host_index"): "host",
    ("torch_xla.runtime", "process_count"): "host_count",
    ("torch_xla.runtime", "addressable_device_count"): "local_device_count",
    ("torch_xla.runtime", "local_device_count"): "local_device_count",
    ("torch_xla.runtime", "local_ordinal"): "local_ordinal",
    ("torch_xla.core.xla_model", "get_local_ordinal"): "local_ordinal",
    ("torch_xla", "device_count"): "local_device_count",
}

# Every call site of a query inside torch_xla 2.9 (module, calling function) -> whether it gets
# the emulated or the real (one-process) answer, and why. tests/test_hosts.py scans the
# installed torch_xla and fails on a call site missing here.
CALLERS = {
    ("torch_xla._internal.rendezvous", "pjrt_rendezvous_handler"):
        ("real", "builds the xla:// TCP store for process_count processes; the emulated hosts "
                 "are one process, so a store of H would wait for H-1 that never come"),
    ("torch_xla.runtime", "_init_world_size_ordinal"):
        ("real", "with one device per process it caches the world size and ordinal process-wide; "
                 "the replica threads share that cache, so the first thread's ordinal would "
                 "answer for all"),
    ("torch_xla.experimental.distributed_checkpoint.manager", "__init__"):
        ("real", "starts the distributed runtime's coordinator for process_count processes"),
    ("torch_xla._internal.tpu", "_spmd_find_master_ip"):
        ("real", "TPU SPMD: gathers each process's IP over the real processes"),
    ("torch_xla.debug.metrics_saver", "_extract_metrics_file"):
        ("real", "names the metrics file by local ordinal; a pod's hosts have a disk each, the "
                 "emulated hosts share one"),
    ("torch_xla.core.xla_model", "is_master_ordinal"):
        ("emulated", "public: true on local ordinal 0 of each host, as on a pod (master_print "
                     "prints once per host)"),
    ("torch_xla.core.xla_model", "get_local_ordinal"): ("emulated", "a query itself (replaced)"),
    ("torch_xla.runtime", "local_device_count"): ("emulated", "a query itself (replaced)"),
    ("torch_xla.runtime", "local_ordinal"): ("emulated", "a query itself (replaced)"),
}
TRUE_CALLERS = frozenset(site for site, (answer, _) in CALLERS.items() if answer == "real")


def bind(layout: HostLayout) -> None:
    """Pin ``layout`` for the calling replica thread."""
    _thread.layout = layout


def register(device_ordinal: int, layout: HostLayout) -> None:
    """Make ``layout`` the answer of every thread working on XLA device ``device_ordinal``
    (autograd's device threads included)."""
    _BY_DEVICE[device_ordinal] = layout


def clear() -> None:
    """Forget every registered device layout (a world's teardown)."""
    _BY_DEVICE.clear()


def current_layout() -> HostLayout | None:
    """The layout the calling thread answers with: its pinned one, else that of the device it
    works on, else ``None`` (the host's main thread, or no world registered)."""
    layout = getattr(_thread, "layout", None)
    if layout is not None or not _BY_DEVICE or threading.current_thread() is threading.main_thread():
        return layout
    import torch_xla
    # Private, torch_xla 2.9 (pinned): the thread's current device, which autograd's device
    # guard sets on its worker threads.
    return _BY_DEVICE.get(torch_xla._XLAC._xla_get_default_device_ordinal())


def _query(original, field):
    def emulated(*args, **kwargs):
        layout = None if getattr(_thread, "real", False) else current_layout()
        if layout is None:
            return original(*args, **kwargs)
        caller = sys._getframe(1)  # not kept: a live frame would keep lazy tensors alive
        site = (caller.f_globals.get("__name__"), caller.f_code.co_name)
        del caller
        if site not in TRUE_CALLERS:
            return getattr(layout, field)
        _thread.real = True  # the original's own queries answer for the real process too
        try:
            return original(*args, **kwargs)
        finally:
            _thread.real = False
    emulated.__name__ = original.__name__
    emulated.__doc__ = original.__doc__
    emulated.__wrapped__ = original
    return emulated


def install() -> None:
    """Replace the :data:`QUERIES` functions with layout-aware ones (process-wide, idempotent).

    A thread with neither a pinned layout nor a registered device (the host's main thread,
    any thread outside a world) gets the original answers.
    """
    with _INSTALL_LOCK:
        for key, field in QUERIES.items():
            if key in _ORIGINALS:
                continue
            module = importlib.import_module(key[0])
            original = _ORIGINALS[key] = getattr(module, key[1])
            setattr(module, key[1], _query(original, field))
