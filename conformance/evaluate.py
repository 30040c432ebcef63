"""The one entry point: ``evaluate(case, impl, runtime, world_size) -> list[Verdict]``.

Every face calls it. It resolves the implementation, dispatches to the evaluator of the row's
kind (:data:`KINDS`, the ``KIND`` each kind module under :mod:`conformance.cases` declares beside
its evaluator), runs on a persistent world of the :class:`Session`, and turns every outcome into
verdicts - one per check the row declares, whatever happens:

* :class:`~conformance.errors.Unsupported` raised anywhere (a replica, a wrapper, a setup, a
  property) -> ``unsupported`` with the reason (the one place it is caught);
* a replica that raised, hung or died -> ``fail`` with the replica's summary in ``reason`` and
  the full text (tracebacks, stacks, log tails) in ``diagnosis``;
* a runtime that cannot run here, an implementation that cannot (``Strategy.unavailable``), or a
  zoo model whose library is not installed -> ``skip`` with the reason.

:func:`kill_rows` runs the kill matrix (every catalog mutant through every case that must kill
it) through the same entry point.
"""
from __future__ import annotations

from conformance.cases.kinds import REGISTRY
from conformance.cases.row import Case
from conformance.cases.validation import kinds
from conformance.errors import Unsupported
from conformance.report.kills import KillRow
from conformance.verdict import Verdict
import copy
import json
from conformance.cases.table import CASES
from conformance.cases.shared.loop import train_replica
from conformance.impls.builtin import resolve_impl
from conformance.impls.mutants.catalog import MUTANTS
from conformance.settings import Settings
from conformance.worlds import isolation
from conformance.worlds.failure import ReplicaError
from conformance.worlds.runtimes import RuntimeUnavailable, WorldKey, check_world, get_runtime, world_key
from fixtures.zoo import unavailable

_UNSUPPORTED = "__unsupported__"


def guarded(ctx, task_fn_, **payload):
    """World task wrapper: run ``task_fn_(ctx, **payload)``; an ``Unsupported`` raised in the
    replica comes back as a marker (re-raised by :meth:`Session.run`)."""
    try:
        return task_fn_(ctx, **payload)
    except Unsupported as exc:
        return {_UNSUPPORTED: exc.reason}


def _jsonable(obj):
    """``obj`` with anything JSON cannot hold turned into its ``str``."""
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        if isinstance(obj, dict):
            return {str(k): _jsonable(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [_jsonable(v) for v in obj]
        return str(obj)


class Session:
    """Persistent worlds and finished runs shared by every evaluation.

    Args:
        pool: the :class:`conformance.worlds.pool.Pool` whose worlds the session runs on
            (default: a new :class:`conformance.worlds.pool.WorldPool`); a
            :class:`conformance.worlds.launched.ExternalPool` makes this process one
            replica of a launcher-started world (non-root ranks get ``[]``).
        settings: the run's :class:`~conformance.settings.Settings`; default: ``Settings.from_env()``.
        profile: overrides ``settings.profile`` (a name of ``conformance.settings.PROFILES``).

    Attributes:
        measured_tolerances: ``{(runtime, W, run): Tolerance}``, the bounds measured on a user's
            model (:func:`conformance.cases.shared.measured.measured_tolerance` keeps them here; a
            run prints each once); shared with the session's lanes (:meth:`lane`).
        subject: the implementation whose case runs now (set by :func:`evaluate`); a world that
            ran another one's cases is put back to its snapshot first (:meth:`run`).
        fresh_worlds: one line per world started anew because what an implementation left in
            it could not be put back (:mod:`conformance.worlds.isolation`).
    """

    def __init__(self, pool=None, profile: str | None = None, settings=None):
        settings = settings or Settings.from_env()
        if profile is not None:
            settings = settings.replace(profile=profile)
        if pool is None:
            from conformance.worlds.pool import WorldPool
            pool = WorldPool(settings)
        self.pool, self.settings, self.profile = pool, settings, settings.profile
        self._memo: dict = {}
        self.measured_tolerances: dict = {}
        self.subject: str | None = None
        self.fresh_worlds: list[str] = []

    def lane(self, pool) -> "Session":
        """Another session of this run on ``pool`` (a lane, :mod:`conformance.cli.lanes`, with
        worlds of its own) that shares this one's finished runs (:meth:`memo`,
        :meth:`trajectories`) and :attr:`measured_tolerances`."""
        other = Session(pool, settings=self.settings)
        other._memo, other.measured_tolerances = self._memo, self.measured_tolerances
        return other

    def memo(self, key, compute):
        """What ``compute()`` returned for ``key``, computed once per session (and its lanes): e.g.
        a collective's verdicts, which no implementation changes. A list comes back as shallow
        copies of its items, which a caller may change (:func:`evaluate` labels each verdict).
        ``None`` (a non-root process of a launcher-built world) is returned, not kept."""
        if key not in self._memo:
            value = compute()
            if value is None:
                return None
            self._memo[key] = value
        value = self._memo[key]
        return [copy.copy(v) for v in value] if isinstance(value, list) else value

    def run(self, runtime: str | WorldKey, world_size: int | None, fn, timeout: float | None = None, **payload):
        """Run ``fn(ctx, **payload)`` on every replica of the world ``runtime`` and ``world_size``
        name (as :meth:`WorldKey.of <conformance.worlds.registry.WorldKey.of>` takes them); results
        by rank, or ``None`` on a non-root process of a launcher-built world.

        Raises:
            Unsupported: a replica raised it.
            ReplicaError: a replica raised anything else, hung or died.
        """
        key = WorldKey.of(runtime, world_size)
        world = self._entered(self.pool.get(key), key)
        out = world.run(guarded, timeout=timeout, task_fn_=fn, **payload)
        if out is None:
            return None
        for r in out:
            if isinstance(r, dict) and _UNSUPPORTED in r:
                raise Unsupported(r[_UNSUPPORTED])
        return out

    def _entered(self, world, key):
        """``world``, ready for :attr:`subject`'s tasks: when another implementation's cases ran in
        it, every replica puts the world's snapshot back first (once per implementation per world:
        :func:`conformance.worlds.isolation.restore_task`); a change that cannot be put back
        retires the world and the pool starts a fresh one."""
        if self.subject is None or getattr(world, "subject", self.subject) == self.subject:
            return world
        if world.subject is not None:
            try:
                got = world.run(isolation.restore_task)
            except ReplicaError as exc:  # the world is broken or reset: a fresh one if broken
                got = [{"fresh": [f"putting the snapshot back failed: {exc.summary()}"]}]
            # every process of a launcher-built world decides alike (rank 0 alone sees the results)
            fresh = self.pool.broadcast(sorted({f for r in got or [] for f in r["fresh"]}))
            if fresh or world.broken:
                world.retire()
                self.fresh_worlds.append(f"{world.describe()} started anew for {self.subject}: {world.subject} "
                                         f"left {'; '.join(fresh)}")
                world = self.pool.get(key)
        world.subject = self.subject
        return world

    def trajectories(self, runtime: str | WorldKey, world_size: int | None, spec) -> list | None:
        """Every replica's :func:`~conformance.cases.shared.loop.train_replica` result (cached per
        world and spec; the world as :meth:`run` takes it)."""
        key = ("trajectories", WorldKey.of(runtime, world_size), spec)
        if key not in self._memo:
            self._memo[key] = self.run(key[1], None, train_replica, spec=spec.as_dict())
        return self._memo[key]

    def prestart(self, runtime: str, world_size: int, impls) -> None:
        """Start, without waiting, the worlds ``impls`` will train on at ``runtime`` x ``world_size``
        (:meth:`conformance.worlds.pool.Pool.prestart`). Nothing is raised: an implementation or
        world that cannot start is reported by :func:`evaluate` when it is used."""
        for impl in impls:
            try:
                row = resolve_impl(impl)
                if runtime in row.unsupported:  # no case of it starts a world there
                    continue
                self.pool.prestart(world_key(runtime, row.topology.get(runtime), world_size))
            except Exception:  # reported where evaluate() uses it
                continue

    def forget(self) -> None:
        """Drop finished runs (long sweeps: calibrate, run --repeat)."""
        self._memo.clear()

    def close(self) -> None:
        self.pool.close()

    def halt(self) -> None:
        """Close the worlds and start no new one (:meth:`conformance.worlds.pool.Pool.halt`)."""
        self.pool.halt()


_DEFAULT: Session | None = None


def default_session() -> Session:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Session()
    return _DEFAULT


def evaluate(case: Case, impl: str, runtime: str, world_size: int, session: Session | None = None,
             *, shrink: bool = True, **overrides) -> list[Verdict]:
    """Verdicts of ``case`` for implementation ``impl`` on ``runtime`` with ``world_size`` replicas.

    ``overrides`` change the run of ``train`` cases (``seed``, ``lr``, ``steps``: calibration and
    flakiness sweeps); for a ``scenario`` case, ``scenario=`` (a
    :class:`~conformance.cases.scenario.format.Scenario`) runs that one scenario only;
    ``shrink=False`` reports a failing property or scenario search as found, not shrunk to a
    minimal counterexample (the kill matrix only needs to know that it fails). Returns one verdict
    per ``case.checks`` entry (``[]`` on a non-root process of a launcher-built world).

    Raises:
        ImplSpecError: ``impl`` names nothing usable (callers validate first).
    """
    session = session or default_session()
    session.subject = impl
    kind = KINDS[case.kind]
    if kind.searches:  # the searches' evaluators read it from overrides
        overrides["shrink"] = shrink
    row = resolve_impl(impl)
    model = case.model
    subject = REGISTRY[case.kind].subject
    # a backend's verdicts carry its name: they are the same whatever DDP runs above it
    label = get_runtime(runtime, session.settings).backend_label() if subject == "backend" else impl

    def each(status, reason, diagnosis=""):
        return [Verdict(case.name, c, label, runtime, model, world_size, status, reason=reason,
                        diagnosis=diagnosis, family=case.family, subject=subject) for c in case.checks]

    if kind.searches and not session.pool.sees_every_result:
        return each("skip", f"{case.family} cases need a world the kit spawns: Hypothesis draws each example "
                    "from the result of the last one, which only the root process of a launcher-built world sees")
    if row.unavailable and kind.needs_impl:
        return each("skip", row.unavailable)
    try:
        check_world(WorldKey(runtime, world_size))
    except RuntimeUnavailable as exc:
        return each("skip", f"runtime {runtime}: {exc}")
    missing = unavailable(model)  # a zoo model whose library is not installed
    if missing:
        return each("skip", missing)
    try:
        if row.unsupported.get(runtime) and kind.needs_impl:
            raise Unsupported(row.unsupported[runtime])
        if case.kind in row.unsupported_kinds:
            raise Unsupported(row.unsupported_kinds[case.kind])
        verdicts = kind.evaluate(case, impl, runtime, world_size, session, overrides)
    except Unsupported as exc:
        return each("unsupported", exc.reason)
    except ReplicaError as exc:
        diag = exc.diagnosis
        culprits = [d.get("rank") for d in diag if d.get("culprit")]
        out = each("fail", exc.summary(), exc.details())
        for v in out:
            v.replicas = _jsonable(diag)
            v.replica = culprits[0] if len(culprits) == 1 else None  # the table's replica column: the culprit
            # (several: none stands out; the reason names them)
            v.first_bad_step = next((d.get("step") for d in diag if d.get("culprit") and d.get("step")), None)
        return out
    if verdicts is None:  # non-root process of a launcher-built world: rank 0 judges
        return []
    for v in verdicts:
        v.case, v.family, v.impl, v.runtime, v.world_size = case.name, case.family, label, runtime, world_size
        v.model, v.subject = model, subject
    return verdicts


#: kind name -> its :class:`~conformance.cases.kinds.Kind` (the registry's, loaded once).
KINDS = kinds()


def kill_rows(runtime: str, world_size: int, session=None, mutants=None, cases=None, progress=None) -> list[KillRow]:
    """The kill matrix: a ``KillRow`` per (catalog mutant, case whose ``must_kill`` names it) on
    one runtime and world size. ``mutants`` / ``cases`` restrict it (default: the whole catalog and
    table). A failing search is not shrunk: a kill needs one failing example."""
    allowed = None if cases is None else {c.name for c in cases}
    rows = []
    for m in mutants or list(MUTANTS):
        for case in CASES.values():
            if m in case.must_kill and (allowed is None or case.name in allowed):
                rows.append(KillRow(runtime, world_size, m, case.name,
                                    evaluate(case, f"mutant:{m}", runtime, world_size, session,
                                             shrink=False)))
                if progress:
                    progress()
    return rows
