"""One ``Settings``: every configuration value of a run, read once by each face.

A face (CLI, pytest plugin, absltest) builds it with :meth:`Settings.from_env`: the environment
variables below are the defaults, the face's options override them, and the value is passed
down explicitly (worlds, sessions, searches). No other module of the kit reads ``os.environ``
for configuration, and nothing is read at import, so an option given always takes effect.

=====================================  ==========================  ========
field                                  environment variable        default
=====================================  ==========================  ========
``replica_timeout`` (s)                ``CONFORMANCE_TIMEOUT``            120
``start_timeout`` (s)                  ``CONFORMANCE_START_TIMEOUT``      180
``collective_timeout`` (s, gloo, least)``CONFORMANCE_COLLECTIVE_TIMEOUT`` 60
``pjrt_collective_bound`` (s)          ``CONFORMANCE_PJRT_COLLECTIVE_BOUND`` 6
``profile``                            ``CONFORMANCE_PROFILE``            dev
``backend`` (torch.distributed, CPU)   ``CONFORMANCE_BACKEND``            gloo
``host_start`` (forkserver, spawn)     ``CONFORMANCE_HOST_START``         forkserver
``lanes`` (cases run side by side)     ``CONFORMANCE_LANES``              2
``topology_nodes`` (most hidden nodes) ``CONFORMANCE_TOPOLOGY_NODES``     6
``topologies`` (examples; 0: profile)  ``CONFORMANCE_TOPOLOGIES``         0
=====================================  ==========================  ========

The default world sizes and implementations per runtime are facts of the runtime adapters
(:class:`conformance.worlds.runtimes.base.Runtime`), read here by name from the runtime registry
(:func:`default_world_sizes`, :func:`default_impls`, :func:`max_world_size`,
:func:`emulated_hosts`); every face uses these, so the same matrix runs whatever the face.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from conformance.errors import UsageError
from conformance.worlds.registry import RUNTIMES, runtime_class

# Emulated hosts of the CPU runtime's worlds (W -> H, torchrun's variables for H nodes x W/H
# replicas; any other W: one host). The two default worlds take the two extreme shapes: W=2 as
# 2 hosts x 1 (a divisor or shard index taken from the local world, a local/global ordinal
# mix-up, is wrong there) and W=3 as 1 host x 3 (a divisor taken from the host count is wrong).
DEFAULT_CPU_HOSTS = {2: 2}
# PJRT (hosts emulated in torch_xla's per-host queries: conformance.worlds.runtimes.pjrt_hosts):
# the same two shapes, and W=4 (CI's parity and core scenarios, feature.subgroups) as 2 hosts x
# 2, where local ordinals and the host count both differ from the global ones.
DEFAULT_PJRT_HOSTS = {2: 2, 4: 2}
# Example budget profiles (their numbers live with the searches, conformance.cases.shared.search).
PROFILES = ("dev", "ci", "ci-pjrt", "thorough")
DEFAULT_PROFILE = "dev"

# field -> (environment variable, default); the single place an environment name is read.
ENVIRONMENT = {
    "replica_timeout": ("CONFORMANCE_TIMEOUT", 120.0),
    "start_timeout": ("CONFORMANCE_START_TIMEOUT", 180.0),
    "collective_timeout": ("CONFORMANCE_COLLECTIVE_TIMEOUT", 60.0),
    "pjrt_collective_bound": ("CONFORMANCE_PJRT_COLLECTIVE_BOUND", 6.0),
    "profile": ("CONFORMANCE_PROFILE", DEFAULT_PROFILE),
    "backend": ("CONFORMANCE_BACKEND", "gloo"),
    "host_start": ("CONFORMANCE_HOST_START", "forkserver"),
    "lanes": ("CONFORMANCE_LANES", 2),
    "topology_nodes": ("CONFORMANCE_TOPOLOGY_NODES", 6),
    "topologies": ("CONFORMANCE_TOPOLOGIES", 0),
}
# Most lanes of one run: each holds its own worlds (a W=3 world is 3 processes).
MAX_LANES = 8
# The most hidden nodes of a generated topology (conformance.cases.scenario.topology), and the most
# topologies one case run may draw.
MAX_TOPOLOGY_NODES = 9
MAX_TOPOLOGIES = 100_000
# How a world's host processes start (conformance.worlds.hoststart).
HOST_STARTS = ("forkserver", "spawn")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Configuration of one run (picklable: it travels to replica hosts).

    Attributes:
        replica_timeout: seconds one task may take on a world before the kit takes every
            replica's stack and decides the culprit.
        start_timeout: seconds a world's hosts may take to start.
        collective_timeout: least seconds of the gloo process group's own timeout (CPU runtime and
            env:// launched worlds; raised above the task bound, see
            :func:`conformance.worlds.runtimes.cpu.process_group_timeout_s`).
        pjrt_collective_bound: seconds a PJRT replica may sit in one collective before the world
            reports it (below XLA's own abort).
        profile: example budget of the property and scenario searches.
        cpu_hosts: ``((W, H), ...)``: the CPU runtime groups a world of W replicas into H emulated
            hosts (:data:`DEFAULT_CPU_HOSTS`; any other W: one host).
        pjrt_hosts: the same for the PJRT runtime's replica threads (:data:`DEFAULT_PJRT_HOSTS`).
        backend: the torch.distributed backend of the CPU runtime's default group: a registered
            name (``gloo``) or ``module:function``, a function that registers one with
            ``torch.distributed.Backend.register_backend`` (run in every replica process before
            ``init_process_group``; see :func:`conformance.worlds.runtimes.cpu.resolve_backend`).
        host_start: how a world's host processes start (:data:`HOST_STARTS`): ``forkserver``, forked
            from one server process that imported torch and the kit's task modules
            (:mod:`conformance.worlds.hoststart`), or ``spawn``, a fresh interpreter each.
        lanes: how many cases ``python -m conformance run`` evaluates side by side, each lane a
            thread of the kit's process with its own worlds (:mod:`conformance.cli.lanes`);
            ``1 <= lanes <= 8``; 1 runs the table in order (as ``-x`` and ``--exitfirst-each`` do).
        progress_every: most seconds between two progress lines when stderr is not a terminal (a
            CI log: one line per finished case run, and one at least this often while a case
            runs); ``0 < progress_every <= 15``.
        topology_nodes: the most hidden nodes of a topology ``scenario.topology`` draws
            (``1 <= topology_nodes <= 9``).
        topologies: the topologies ``scenario.topology`` draws per world size (0: the profile's;
            ``0 <= topologies <= 100000``).
    """

    replica_timeout: float = ENVIRONMENT["replica_timeout"][1]
    start_timeout: float = ENVIRONMENT["start_timeout"][1]
    collective_timeout: float = ENVIRONMENT["collective_timeout"][1]
    pjrt_collective_bound: float = ENVIRONMENT["pjrt_collective_bound"][1]
    profile: str = DEFAULT_PROFILE
    cpu_hosts: tuple = tuple(DEFAULT_CPU_HOSTS.items())
    pjrt_hosts: tuple = tuple(DEFAULT_PJRT_HOSTS.items())
    progress_every: float = 10.0
    backend: str = "gloo"
    host_start: str = "forkserver"
    lanes: int = ENVIRONMENT["lanes"][1]
    topology_nodes: int = ENVIRONMENT["topology_nodes"][1]
    topologies: int = ENVIRONMENT["topologies"][1]

    def __post_init__(self):
        if not isinstance(self.progress_every, (int, float)) or not 0 < self.progress_every <= 15:
            raise UsageError(f"progress_every: need 0 < seconds <= 15, got {self.progress_every!r}")
        for name in ("replica_timeout", "start_timeout", "collective_timeout", "pjrt_collective_bound"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise UsageError(f"{_option(name)}: need seconds > 0, got {value!r}")
        if not isinstance(self.backend, str) or not self.backend.strip() or self.backend.count(":") > 1:
            raise UsageError(f"{_option('backend')}: need a backend name or module:function, got {self.backend!r}")
        if self.host_start not in HOST_STARTS:
            raise UsageError(f"{_option('host_start')}: need one of {', '.join(HOST_STARTS)}, got {self.host_start!r}")
        if isinstance(self.lanes, bool) or not isinstance(self.lanes, int) or not 1 <= self.lanes <= MAX_LANES:
            raise UsageError(f"{_option('lanes')}: need a whole number of lanes from 1 to {MAX_LANES}, got {self.lanes!r}")
        for name, low, high in (("topology_nodes", 1, MAX_TOPOLOGY_NODES), ("topologies", 0, MAX_TOPOLOGIES)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UsageError(f"{_option(name)}: need a whole number from {low} to {high}, got {value!r}")
        if self.profile not in PROFILES:
            raise UsageError(f"{_option('profile')}: unknown profile {self.profile!r}; known: {', '.join(PROFILES)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options) -> "Settings":
        """Environment variables as defaults, ``options`` (``None`` = not given) over them.

        Raises:
            UsageError: a value that is not a number of seconds > 0, or an unknown profile
                (the message names the option or variable).
        """
        env = os.environ if environ is None else environ
        values = {}
        for name, (var, default) in ENVIRONMENT.items():
            given = options.pop(name, None)
            if given is not None:
                values[name] = given
            elif env.get(var):
                values[name] = _parse(name, var, env[var], default)
        if options:
            raise TypeError(f"unknown settings: {', '.join(sorted(options))}")
        return cls(**values)

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)


def _parse(name, var, text, default):
    if isinstance(default, str):
        return text
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise UsageError(f"{var}={text!r}: not a whole number") from None
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{var}={text!r}: not a number of seconds") from None


def _option(name: str) -> str:
    return f"--{name.replace('_', '-')} / {ENVIRONMENT[name][0]}"


def emulated_hosts(settings: "Settings", world_size: int, runtime: str = "cpu") -> int:
    """How many emulated hosts a ``runtime`` world of ``world_size`` replicas is grouped into
    (a divisor of ``world_size``; 1 on a runtime without emulated hosts).

    Raises:
        UsageError: the configured host count does not divide ``world_size``.
    """
    field = _fact(runtime, "hosts_field")  # the Settings field of its hosts, if any
    hosts = dict(getattr(settings, field)).get(world_size, 1) if field else 1
    if world_size % hosts:
        raise UsageError(f"{hosts} emulated hosts cannot hold {world_size} replicas evenly")
    return hosts


def default_world_sizes(runtime: str) -> tuple[int, ...]:
    """World sizes a run on ``runtime`` covers unless told (the adapter's ``default_world_sizes``;
    raises ``KeyError`` for an unknown runtime)."""
    return tuple(runtime_class(runtime).default_world_sizes)


def default_impls(runtime: str) -> tuple[str, ...]:
    """Implementations a run on ``runtime`` covers unless told (the adapter's ``default_impls``;
    raises ``KeyError`` for an unknown runtime)."""
    return tuple(runtime_class(runtime).default_impls)


def max_world_size(runtime: str) -> int | None:
    """Largest world ``runtime`` runs (the adapter's ``max_world_size``); ``None``: unknown runtime."""
    return _fact(runtime, "max_world_size")


def _fact(runtime: str, name: str):
    """Attribute ``name`` of ``runtime``'s adapter class; ``None`` for a name the registry does not
    hold (a topology world, e.g. ``pjrt_spmd``)."""
    return getattr(runtime_class(runtime), name) if runtime in RUNTIMES else None


def use_hypothesis_cache() -> str:
    """Point Hypothesis's files (its constants cache; the kit keeps no example database) at
    ``$XDG_CACHE_HOME/ddp-conformance/hypothesis`` (default ``~/.cache/...``) unless
    ``HYPOTHESIS_STORAGE_DIRECTORY`` is set, so a run leaves no ``.hypothesis/`` in the folder it
    starts in. Set in the environment: spawned replicas inherit it. Returns the folder."""
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "ddp-conformance", "hypothesis")
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:  # no writable home: a per-user temp folder, still not the cwd
            import tempfile
            folder = os.path.join(tempfile.gettempdir(), f"ddp-conformance-hypothesis-{os.getuid()}")
        os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = folder
    return os.environ["HYPOTHESIS_STORAGE_DIRECTORY"]


def default_help(name: str) -> str:
    """``default <value>; env <VARIABLE>`` of the :class:`Settings` field ``name``, for a face's
    help text (so no face restates a default)."""
    env, default = ENVIRONMENT[name]
    return f"default {default:g}; env {env}" if isinstance(default, float) else f"default {default}; env {env}"
