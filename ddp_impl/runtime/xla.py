"""torch_xla (PJRT) runtime support: collectives, step sync, rank bindings, launch.

Everything here is written for, and tested on, torch_xla 2.9.x (see
:data:`SUPPORTED_TORCH_XLA`); :func:`require_torch_xla` refuses other versions
with a clear error because :func:`mark_step` relies on private torch_xla APIs.

Multi-replica collectives on the PJRT *CPU* device (one process, one Python
thread per replica - the TPU v2/v3 shape) are called unsupported upstream
(pytorch/xla issues #5005, #9089, #9496) and hang or abort out of the box. They
work with three measures, each answering one measured cause (docs/runtimes/pjrt.md, "the PJRT CPU causes")
and each applied here:

1. **Identical graphs on every replica, compiled once.** XLA:CPU uses the HLO
   module's unique id as a collective's op_id when it has no channel id, so
   replicas that compiled separately never meet. :func:`mark_step` serialises
   the step marker (and therefore the first compilation) with a process-wide
   lock, so later replicas hit the compile cache and share one executable. For
   that the lazy graph must be the same on every replica: :class:`XlaCollectives`
   never bakes a rank-dependent Python scalar into a graph (ranks live on the
   device as tensors, or are not needed at all).
2. **A large enough execution pool.** ``XLA_THREAD_POOL_SIZE`` must be at least
   the number of replicas (:func:`cpu_env` sets it).
3. **A step sync that does not deadlock on the GIL.** ``torch_xla.sync()`` ends
   by resetting the all-reduce token, which can free a buffer still used by the
   in-flight collective and wait for it while holding the GIL.
   :func:`mark_step` waits for the device first and resets the token only then.

4. **No buffer donation.** With input/output aliasing (torch_xla's default) the
   step marker donates the input buffers of tensors updated in place, and the
   calling thread can end up destroying a donated buffer still held by the
   execution it just launched: PJRT then waits, inside ``_xla_step_marker``
   (``XLAGraphExecutor::Async`` destructor -> ``CommonPjRtBuffer::ReleaseBuffer``,
   seen in gdb), for that execution - whose collective waits for the replicas
   queued on the compile lock this thread holds. XLA aborts after 10 s
   ("only 1 of them arrived"). Measured on 2.9 with BatchNorm buffers that came
   straight from the host (``broadcast_buffers=False``): 5 of 9 runs aborted
   with aliasing, 18 of 18 passed with ``XLA_ENABLE_PARAM_ALIASING=0``, which
   :func:`cpu_env` and :func:`spawn` set (a copy per step instead of an
   in-place update: only memory, not values, changes).

5. **Graphs that do not depend on values.** torch_xla inlines 0-dim tensors
   holding 0 or 1 as constants ("special scalars"), and its device-data cache
   makes equal 0-dim values share one buffer, which becomes one graph
   parameter instead of two. Either way a rank-dependent *value* changes the
   graph. Measured on 2.9: BatchNorm ``num_batches_tracked`` equal in two
   layers on one replica and different on the other made XLA abort the host
   (the cache; 30 of 30 such runs passed with it off), and the IR of a 0-dim
   ``0.0`` moved to the device is a constant (special scalars).
   :func:`value_independent_graphs` switches both off (process-wide; the PJRT
   runtime adapter and :func:`spawn` call it).

Use :func:`mark_step` instead of ``torch_xla.sync()`` / ``xm.mark_step()`` in
replica threads, and call it before reading values back (``.cpu()``,
``.item()``) from a graph that contains a collective: a read forces its own
compilation outside the lock.
"""
from __future__ import annotations

import datetime
import functools
import os
import threading

import torch

from ddp_impl.runtime.types import Completed, RankBindings
from importlib import metadata, util

# The torch_xla (and matching torch) minor version this module is written for.
# mark_step() uses private torch_xla APIs whose behaviour was measured on it.
SUPPORTED_TORCH_XLA = "2.9"
# Set to 1 to run on another torch_xla version at your own risk.
ALLOW_UNTESTED_ENV = "DDP_IMPL_ALLOW_UNTESTED_TORCH_XLA"
# XLA_THREAD_POOL_SIZE default for CPU replicas: 64 was measured enough for
# up to 16 replicas; it must be >= the number of replicas.
DEFAULT_THREAD_POOL = 64
# How to get torch_xla: the kit is not on PyPI, and torch_xla needs the torch of its own
# release (pyproject's pjrt extra pins the pair), so the hint names a clone and a fresh env.
PJRT_INSTALL_HINT = (f"from a clone, in an environment of its own: pip install -e '.[pjrt]' (pins "
                     f"torch=={SUPPORTED_TORCH_XLA}.0 with torch_xla=={SUPPORTED_TORCH_XLA}.0, replacing a "
                     f"newer torch); or tox -e pjrt")
# Measure 4 (see the module docstring): no input/output aliasing (buffer donation).
PARAM_ALIASING_ENV = "XLA_ENABLE_PARAM_ALIASING"

DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)


class TorchXlaUnavailable(RuntimeError):
    """torch_xla is missing or not a supported version; the message says which."""


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def torch_xla_problem() -> str | None:
    """Why this module cannot run here (one line), or ``None`` when it can.

    Reads installed package metadata only: torch_xla is *not* imported, so this
    is cheap and safe in processes that must stay plain-CPU.
    """
    if util.find_spec("torch_xla") is None:
        return f"torch_xla is not installed ({PJRT_INSTALL_HINT})"
    try:
        xla_version = metadata.version("torch_xla")
    except metadata.PackageNotFoundError:
        xla_version = "unknown"
    torch_version = torch.__version__
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        return None
    if _minor(xla_version) != SUPPORTED_TORCH_XLA:
        return (f"torch_xla {xla_version} is not supported (need {SUPPORTED_TORCH_XLA}.x; "
                f"set {ALLOW_UNTESTED_ENV}=1 to try anyway)")
    if _minor(torch_version) != SUPPORTED_TORCH_XLA:
        return (f"torch {torch_version} does not match torch_xla {xla_version} "
                f"(need torch {SUPPORTED_TORCH_XLA}.x)")
    return None


@functools.lru_cache(maxsize=None)
def require_torch_xla():
    """Import and return ``torch_xla`` after checking its version.

    Raises:
        TorchXlaUnavailable: not installed, import fails, or not 2.9.x (unless
            ``DDP_IMPL_ALLOW_UNTESTED_TORCH_XLA=1``).
    """
    problem = torch_xla_problem()
    if problem:
        raise TorchXlaUnavailable(problem)
    try:
        import torch_xla
        import torch_xla.core.xla_model  # noqa: F401  (registers xm)
        import torch_xla.runtime  # noqa: F401
    except Exception as exc:  # a broken install: say so in one line
        raise TorchXlaUnavailable(f"import torch_xla failed: {type(exc).__name__}: {exc}") from exc
    if os.environ.get(ALLOW_UNTESTED_ENV) != "1" and _minor(torch_xla.__version__) != SUPPORTED_TORCH_XLA:
        raise TorchXlaUnavailable(f"torch_xla {torch_xla.__version__} is not supported "
                                  f"(need {SUPPORTED_TORCH_XLA}.x)")
    return torch_xla


def cpu_env(num_devices: int) -> dict:
    """Environment for one process driving ``num_devices`` PJRT CPU replicas.

    Must be in ``os.environ`` before the XLA runtime initialises.
    """
    return {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(num_devices),
            "XLA_THREAD_POOL_SIZE": str(max(DEFAULT_THREAD_POOL, 2 * num_devices)),
            PARAM_ALIASING_ENV: "0",
            "PJRT_LOCAL_PROCESS_RANK": "0", "PJRT_LOCAL_PROCESS_COUNT": "1"}


#: XLA:CPU flags for the kit's PJRT CPU worlds, each appended to ``XLA_FLAGS`` unless it is set
#: there already (a user's choice wins). The kit's models are tiny and every distinct step graph
#: is compiled once, so compilation, not execution, is a run's time. Both change code
#: generation, not the HLO the device runs (docs/runtimes/pjrt.md, "Compile time"). Measured on
#: 48 compilations of 16 generated scenarios (W=2, 2 cores):
#:   LLVM optimisation level 0: 57.6 -> 23.5 s at load ~9 (12.0 -> 6.9 s quiet);
#:   the legacy loop emitters instead of XLA:CPU's MLIR fusion emitters: 6.1-7.4 -> 4.0-4.1 s
#:   quiet (four runs);
#:   one LLVM module per compilation instead of 32 (each builds its own LLVM target machine,
#:   ~5 % of a run's CPU samples in ``perf``): the default PJRT run 53.4-60.3 -> 43.2-48.0 s,
#:   96-108 -> 75-83 busy core-seconds (three interleaved rounds, 2026-12-03; benchmarks/README.md).
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                      "--xla_cpu_parallel_codegen_split_count=1")


def fast_compile_flags(xla_flags: str = "") -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with each of :data:`FAST_COMPILE_FLAGS` appended
    that it does not set already (a user's choice wins)."""
    out = xla_flags.strip()
    for flag in FAST_COMPILE_FLAGS:
        name = flag.split("=", 1)[0]
        if name not in xla_flags.replace("=", " ").split():
            out = f"{out} {flag}".strip()
    return out


def to_host(tensors: list) -> list:
    """CPU copies of ``tensors`` (XLA tensors, any shapes and dtypes) in one device-to-host
    transfer, as ``torch_xla.core.xla_model``'s save path makes them (private
    ``_xla_get_cpu_tensors``: the version is pinned). A pending tensor is computed first, as
    ``.cpu()`` would."""
    return list(require_torch_xla()._XLAC._xla_get_cpu_tensors(list(tensors)))


# ---------------------------------------------------------------------------
# Step sync
# ---------------------------------------------------------------------------

# Process-wide: serialises the step marker so the first compilation of a graph
# happens once and every replica thread runs the same executable (notes, cause 1).
_COMPILE_LOCK = threading.Lock()


def _device_str(device) -> str:
    xla = require_torch_xla()
    return str(device) if device is not None else xla._XLAC._xla_get_default_device()


def mark_step(device=None) -> None:
    """Cut and run the pending lazy graph of ``device`` and wait for it.

    The deadlock-free replacement for ``torch_xla.sync()`` on multi-replica
    PJRT CPU (docs/runtimes/pjrt.md, the PJRT CPU causes 1 and 3;
    upstream pytorch/xla #5005, #9089, #9496 call CPU collectives unsupported).
    Steps:

    1. hold a reference to the device's current all-reduce token, so the buffer
       behind it cannot be freed while the collective that produced it runs;
    2. run the step marker with ``wait=False`` under the process-wide compile
       lock (one compilation per graph, shared by all replicas);
    3. wait for this device's work with ``_xla_wait_device_ops``, which releases
       the GIL so the other replica threads can reach the collective;
    4. only then drop the token reference and reset the token (what
       ``torch_xla.sync()`` does too early, while holding the GIL).

    It also runs the step closures (``xm.add_step_closure``) as
    ``torch_xla.sync()`` does. Every replica must call it the same number of
    times with the same pending graph.

    Args:
        device: the replica's XLA device (default: the calling thread's).

    Raises:
        TorchXlaUnavailable: see :func:`require_torch_xla`.
    """
    xla = require_torch_xla()
    import torch_xla.core.xla_model as xm
    C = xla._XLAC
    dev = _device_str(device)
    try:  # private API, torch_xla 2.9 (pinned above)
        token = C._get_all_reduce_token(dev)
    except IndexError:  # no collective issued on this device yet
        token = None
    with _COMPILE_LOCK:
        C._xla_step_marker(dev, [], wait=False)
    C._xla_wait_device_ops(C._xla_real_devices([dev]))
    xm._run_step_closures()
    del token
    C._set_all_reduce_token(dev, None)


def value_independent_graphs() -> None:
    """Make a replica's lazy graph depend on tensor shapes only, never on values.

    Measure 5 of the module docstring: turns off torch_xla's special-scalar
    inlining (0-dim 0/1 become constants) and its device-data cache (equal
    0-dim values share one buffer, so one graph parameter), both process-wide.
    Private APIs of torch_xla 2.9 (pinned). Idempotent; call it once per
    process before the replicas build graphs.
    """
    C = require_torch_xla()._XLAC
    C._set_xla_handle_special_scalars(False)
    C._set_xla_enable_device_data_cache(False)


# Name used in the kit's ReplicaContext and in the brief.
step_sync = mark_step


# ---------------------------------------------------------------------------
# Rank bindings
# ---------------------------------------------------------------------------

def pjrt_bindings() -> RankBindings:
    """The calling replica's :class:`RankBindings` on PJRT.

    torch_xla keeps the default device per *thread* (``_xla_set_default_device``
    is thread-local; verified on 2.9), and its runtime queries derive the
    ordinal from that device, so in the one-process x W-threads topology each
    replica thread gets: process index 0, process count 1, global ordinal =
    local ordinal = its device's ordinal (0..W-1), world size W, local device
    count W. Everything is read through ``torch_xla.runtime``'s functions, so
    where those answer per emulated host (the conformance kit's PJRT worlds,
    docs/multi-host.md) the bindings are the emulated host's. World size is
    computed from the replication devices rather than
    ``torch_xla.runtime.world_size()``, whose process-wide cache is poisoned
    with 1 if it is first called before replication is set up. The local
    ordinal is torch_xla's (index among the replicas of the host *machine*);
    the local device count is the replicas of this *process*.

    Raises:
        TorchXlaUnavailable: see :func:`require_torch_xla`.
        ValueError: inconsistent values (e.g. an ordinal outside the world).
    """
    xla = require_torch_xla()
    import torch_xla.runtime as xr
    C = xla._XLAC
    replicated = C._xla_get_replication_devices_count() > 0
    world = xr.global_device_count() if replicated else 1
    ordinal = C._xla_get_default_device_ordinal() if replicated else 0
    local_count = xr.addressable_device_count() if replicated else 1
    local = (xr.local_ordinal() if replicated else 0)
    b = RankBindings(process_index=xr.process_index(), process_count=xr.process_count(),
                     global_ordinal=ordinal, local_ordinal=local, world_size=world,
                     local_device_count=local_count)
    host_devices = xr.local_device_count() if replicated else 1
    if not (0 <= b.global_ordinal < b.world_size and 0 <= b.local_ordinal < host_devices
            and 0 <= b.process_index < b.process_count):
        raise ValueError(f"inconsistent PJRT bindings: {b}")
    return b


# ---------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------

def _wide(t) -> bool:
    """More precise than float32 (float64, complex128)."""
    return t.element_size() > (8 if t.is_complex() else 4)


def _xla_scale(t, scale) -> float:
    """The ``scale=`` given to ``xm.all_reduce``: torch_xla applies it in float32 (measured on
    2.9: a float64 mean over 3 replicas deviated 1e-9 from the float64 reference; 1/2, 1/4 and
    1/8 are exact), so wider tensors are reduced unscaled and scaled in their own dtype."""
    return 1.0 if _wide(t) else float(scale)


def _scaled(reduced, t, scale):
    """``reduced`` times ``scale`` in its own dtype where :func:`_xla_scale` left it out."""
    return reduced * scale if _wide(t) and scale != 1.0 else reduced


class XlaCollectives:
    """:class:`ddp_impl.runtime.collectives.Collectives` over all replicas, on torch_xla.

    One instance per replica (thread), bound to that replica's device. Methods
    are lazy, like every XLA op: they add collectives to the pending graph, which
    runs at the next :func:`mark_step`. Tensors must live on this replica's XLA
    device. Every replica must issue the same collectives in the same order.

    * ``all_reduce_``: ``t.copy_(xm.all_reduce(SUM, t, scale=s))``. ``s`` is
      the same on every replica, so the graphs stay identical. Not the in-place
      list form ``xm.all_reduce(SUM, [t])``: its write is lost when ``t`` is a
      view (a gradient accumulated in place is one). With one replica
      it only applies the scale (``xm.all_reduce`` returns early and would
      ignore it).
    * ``all_reduce_async_``: the same, returning an already-complete handle.
    * ``all_reduce_many``: the functional all-reduce of each of a list of
      tensors, returning new tensors (the reference DDP reduces a bucket so,
      without packing a flat buffer).
    * ``all_gather``: a real XLA all-gather (``pin_layout=False``; the pinned
      variant pads by the Python ordinal, which makes graphs differ per
      replica), split into one tensor per rank. Values are copied, not summed:
      NaN and inf survive; only the sign of zero is lost (XLA:CPU's all-gather
      returns +0.0 for -0.0, measured on 2.9).
    * ``broadcast_``: ``all_gather`` then copy row ``src`` in place: exact as
      ``all_gather`` (a masked all-reduce would turn inf into NaN), and no
      rank-dependent scalar in the graph (``src`` is the same everywhere).
      Costs ``world_size`` times the tensor's memory transiently.
    * ``barrier``: all-reduce of a one-element device tensor followed by
      :func:`mark_step`; returns when every replica has reached it. It cuts the
      graph: pending work is executed.
    * ``sync``: :func:`mark_step` on this replica's device (the optional
      method of the interface: call it before reading a collective's result
      on the host; the reference DDP's ``find_unused_parameters`` path does).

    XLA rejects a graph that mixes layout-pinned and unpinned all-reduces ("HloModule
    has a mix of layout constrained and unconstrained AllReduce instructions").
    ``xm.all_reduce``/``xm.optimizer_step`` pin by default, torch.distributed's
    ``xla`` backend does not; pass ``pin_layout=False`` to share a graph with
    ``dist.all_reduce``, or :func:`mark_step` between the two.

    Args:
        device: the replica's XLA device (default: the calling thread's).
        bindings: its :class:`RankBindings` (default: :func:`pjrt_bindings`).
        pin_layout: layout pinning of ``all_reduce_`` (default ``True``, as
            ``xm.all_reduce``).
        groups: replica groups (lists of global ordinals covering every replica, e.g.
            ``[[0, 1], [2, 3]]``): the collectives run within this replica's group
            (``groups=`` of ``xm.all_reduce`` / ``xm.all_gather``, one graph on every
            replica); ``rank``, ``world_size`` and ``src`` are then the group's. ``None``:
            all replicas.
    """

    def __init__(self, device=None, bindings: RankBindings | None = None, *, pin_layout: bool = True,
                 groups=None):
        require_torch_xla()
        self.pin_layout = pin_layout
        self.device = torch.device(_device_str(device))
        b = bindings or pjrt_bindings()
        self.bindings = b
        self.groups = [list(g) for g in groups] if groups is not None else None
        mine = next((g for g in self.groups if b.global_ordinal in g), None) if self.groups else None
        if self.groups is not None and mine is None:
            raise ValueError(f"groups {groups} do not hold replica {b.global_ordinal}")
        self.rank = mine.index(b.global_ordinal) if mine else b.global_ordinal
        self.world_size = len(mine) if mine else b.world_size
        # A singleton group still issues its collectives: every replica's graph must be the same.
        self._alone = self.world_size == 1 and self.groups is None

    def _check(self, tensor, what):
        if not isinstance(tensor, torch.Tensor) or tensor.device != self.device:
            where = tensor.device if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(f"XlaCollectives.{what}: tensor must be on {self.device}, got {where}")

    def all_reduce_(self, tensor, *, scale=1.0):
        import torch_xla.core.xla_model as xm
        self._check(tensor, "all_reduce_")
        if self._alone:
            if scale != 1.0:
                tensor.mul_(scale)
            return tensor
        # Functional all-reduce, then copy_ through the dispatcher. xm.all_reduce's
        # in-place (list) form writes the XLA tensor underneath torch's
        # functionalization layer, and the write is lost when the tensor is a view
        # of another (e.g. a gradient accumulated in place under no_sync: measured
        # on 2.9, the replicas kept their local gradients; the kit's no_sync feature
        # check on PJRT, the feature cases catch it).
        reduced = _scaled(xm.all_reduce(xm.REDUCE_SUM, tensor, scale=_xla_scale(tensor, scale),
                                        groups=self.groups, pin_layout=self.pin_layout), tensor, scale)
        with torch.no_grad():
            tensor.copy_(reduced)
        return tensor

    def all_reduce_many(self, tensors, *, scale=1.0):
        """Sum each of ``tensors`` over replicas, then scale; returns new tensors
        (functional ``xm.all_reduce`` per tensor, so a view's value is never lost;
        the inputs are left as they were). Lazy: one graph with the step's."""
        import torch_xla.core.xla_model as xm
        for t in tensors:
            self._check(t, "all_reduce_many")
        if self._alone:
            return [t * scale if scale != 1.0 else t.clone() for t in tensors]
        return [_scaled(xm.all_reduce(xm.REDUCE_SUM, t, scale=_xla_scale(t, scale), groups=self.groups,
                                      pin_layout=self.pin_layout), t, scale) for t in tensors]

    def all_reduce_async_(self, tensor, *, scale=1.0):
        """:meth:`all_reduce_`, recorded lazily like every XLA op; the handle it
        returns is already complete (no host sync per call: the collective runs
        with the step's graph)."""
        return Completed(self.all_reduce_(tensor, scale=scale))

    def _gather(self, tensor):
        import torch_xla.core.xla_model as xm
        flat = tensor.detach().reshape(1, -1) if tensor.dim() == 0 else tensor.detach().unsqueeze(0)
        return xm.all_gather(flat, dim=0, groups=self.groups, pin_layout=False)  # [world_size, *shape]

    def all_gather(self, tensor):
        self._check(tensor, "all_gather")
        if self._alone:
            return [tensor.detach().clone()]
        gathered = self._gather(tensor)
        return [gathered[i].reshape(tensor.shape) for i in range(self.world_size)]

    def broadcast_(self, tensor, src=0):
        self._check(tensor, "broadcast_")
        if not 0 <= src < self.world_size:
            raise ValueError(f"broadcast_: src {src} outside 0..{self.world_size - 1}")
        if self._alone:
            return tensor
        gathered = self._gather(tensor)
        with torch.no_grad():
            tensor.copy_(gathered[src].reshape(tensor.shape))
        return tensor

    def barrier(self):
        t = torch.zeros(1, device=self.device)
        self.all_reduce_(t)
        mark_step(self.device)

    def sync(self):
        """Run this replica's pending graph (:func:`mark_step`) so results of
        collectives can be read on the host (``.cpu()``, ``.tolist()``). Every
        replica must call it at the same point."""
        mark_step(self.device)


# ---------------------------------------------------------------------------
# torch.distributed and launching
# ---------------------------------------------------------------------------

_PG_LOCK = threading.Lock()
_PG_OWNED = {"initialised": False}


def init_pjrt_process_group(timeout: datetime.timedelta = DEFAULT_TIMEOUT, **kwargs) -> bool:
    """Initialise torch.distributed's ``xla`` backend with rank = process index.

    JAX semantics, as :mod:`ddp_impl.runtime.launch`: rank = :func:`process_index`,
    world size = process count. torch_xla's ``xla://`` rendezvous handler would
    instead impose rank = global ordinal of the calling thread and world size =
    replica count, so its store is used but its rank is not:

    * process count 1 (one host; PJRT CPU, a single TPU host): an in-memory
      ``HashStore`` - no TCP port, so concurrent worlds cannot clash;
    * process count > 1: the store ``xla://`` builds (TCP at ``MASTER_ADDR``/
      ``MASTER_PORT``, or torchelastic's).

    Single-replica processes (one device per process): rank == global ordinal,
    exactly what ``xla://`` gives. Multi-replica processes (CPU threads, TPU
    v2/v3): the default group is process-global, so only one thread can
    initialise it; this function is thread-safe and idempotent per process - the
    first caller initialises, later callers (other replica threads) return
    ``False`` without touching it. Then ``dist.get_rank()`` is the *process*
    index in every thread (0 on one host), not the replica; and the ``xla``
    backend's collectives still span *all replicas* (``ProcessGroupXla``
    delegates to ``xm.all_reduce`` and ignores its own size), so every replica
    thread must call them, followed by :func:`mark_step`. For per-replica
    collectives use :class:`XlaCollectives`.

    Args:
        timeout: stored in the group (the ``xla`` backend does not enforce it).
        **kwargs: passed to ``torch.distributed.init_process_group``.

    Returns:
        ``True`` if this call initialised the group, ``False`` if an earlier
        call of this process did.

    Raises:
        RuntimeError: torch.distributed was initialised by someone else.
        TorchXlaUnavailable: see :func:`require_torch_xla`.
    """
    require_torch_xla()
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401  registers 'xla' and 'xla://'
    with _PG_LOCK:
        if dist.is_initialized():
            if _PG_OWNED["initialised"]:
                return False
            raise RuntimeError("torch.distributed is already initialised (not by ddp_impl.runtime.xla)")
        # The real process, not pjrt_bindings(): the group is process-wide, and a host the kit
        # emulates per replica thread is no process a TCP store could wait for.
        C = require_torch_xla()._XLAC
        index, count = C._xla_get_process_index(), C._xla_get_num_processes()
        if count == 1:
            store = dist.HashStore()
        else:
            from torch_xla._internal import rendezvous
            store, _, _ = next(rendezvous.pjrt_rendezvous_handler("xla://", timeout=timeout))
        dist.init_process_group("xla", store=store, rank=index, world_size=count, timeout=timeout, **kwargs)
        _PG_OWNED["initialised"] = True
        return True


class _SpawnTarget:
    """Picklable per-replica entry: optional process group, then ``fn(ordinal, *args)``."""

    def __init__(self, fn, args, init_torch_distributed):
        self.fn, self.args, self.init = fn, tuple(args), init_torch_distributed

    def __call__(self, index, *args):
        value_independent_graphs()
        if not self.init:
            return self.fn(index, *self.args)
        import torch.distributed as dist
        init_pjrt_process_group()
        try:
            return self.fn(index, *self.args)
        finally:
            _release_process_group(dist)


_PG_USERS = {"left": None}


def _release_process_group(dist):
    """Destroy the group when the last replica thread of this process finishes."""
    C = require_torch_xla()._XLAC
    with _PG_LOCK:
        if _PG_USERS["left"] is None:
            _PG_USERS["left"] = C._xla_num_devices()  # this process's replica threads
        _PG_USERS["left"] -= 1
        if _PG_USERS["left"] == 0 and dist.is_initialized() and _PG_OWNED["initialised"]:
            dist.destroy_process_group()
            _PG_OWNED["initialised"] = False
            _PG_USERS["left"] = None


def spawn(fn, args=(), nprocs: int | None = None, init_torch_distributed: bool = False,
          start_method: str = "spawn"):
    """Run ``fn(global_ordinal, *args)`` on every PJRT replica via torch_xla's launcher.

    Wraps ``torch_xla.distributed.xla_multiprocessing.spawn`` (what
    ``torch_xla.launch`` calls outside torchelastic): one process per chip and a
    thread per device on multi-device processes. With
    ``init_torch_distributed=True`` torch.distributed is initialised once per
    *process* (see :func:`init_pjrt_process_group`; every replica thread waits
    for it) and destroyed when the process's last replica returns. Default off,
    as the seed: TCP initialisation is flaky on large pods.

    On CPU (``PJRT_DEVICE=CPU``), ``nprocs`` > 1 sets ``CPU_NUM_DEVICES`` and
    ``XLA_THREAD_POOL_SIZE`` (and, for several replicas,
    ``XLA_ENABLE_PARAM_ALIASING=0``) defaults for the child; use :func:`mark_step`
    instead of ``torch_xla.sync()`` in ``fn``.

    Args:
        fn: module-level function (pickled by reference).
        nprocs: ``None`` (all devices), 1, or on CPU the number of replicas.

    Raises:
        TorchXlaUnavailable: see :func:`require_torch_xla`.
        ValueError: ``nprocs`` torch_xla does not accept for this device.
    """
    require_torch_xla()
    import torch_xla.distributed.xla_multiprocessing as xmp
    if os.environ.get("PJRT_DEVICE", "").upper() == "CPU":
        if nprocs not in (None, 1):
            os.environ["CPU_NUM_DEVICES"] = str(nprocs)
            nprocs = None
        n = int(os.environ.get("CPU_NUM_DEVICES", "1"))
        os.environ.setdefault("XLA_THREAD_POOL_SIZE", str(max(DEFAULT_THREAD_POOL, 2 * n)))
        if n > 1:
            os.environ.setdefault(PARAM_ALIASING_ENV, "0")
    return xmp.spawn(_SpawnTarget(fn, args, init_torch_distributed), args=(),
                     nprocs=nprocs, start_method=start_method)


__all__ = ["SUPPORTED_TORCH_XLA", "TorchXlaUnavailable", "XlaCollectives", "cpu_env", "fast_compile_flags",
           "init_pjrt_process_group", "mark_step", "pjrt_bindings", "require_torch_xla",
           "spawn", "step_sync", "torch_xla_problem", "value_independent_graphs"]
