"""The ``train`` kind: the standard training loop on every replica
(:func:`~conformance.cases.shared.loop.train_replica`), judged against the single-device
reference (:mod:`~conformance.cases.shared.reference`) by the check table and by replica
agreement (:mod:`conformance.cases.shared.checks`)."""
from __future__ import annotations

import re
from dataclasses import replace

from fixtures.models import MODELS

from conformance.cases.shared.checks import AGREEMENT, CHECKS, judge, judge_agreement
from conformance.cases.kinds import Kind
from conformance.cases.shared.loop import RunSpec, rank_seed
from conformance.cases.shared.measured import measured_tolerance, stated, user_run
from conformance.cases.shared.setups import SETUPS, replica_groups
from conformance.cases.shared.reference import reference_run
from conformance.cases.shared.transparency import TRANSPARENCY, judge_transparency
from conformance.tolerances import MIN_WORLD_SIZE, lookup
from conformance.errors import Unsupported
from conformance.verdict import BAD, Verdict
from conformance.impls.builtin import resolve_impl
from conformance.worlds.runtimes import world_key


def train_checks(model: str, run: dict) -> tuple:
    """The checks a ``train`` row on ``model`` with run overrides ``run`` reports: the
    check-table rows that apply to it, then replica agreement and transparency."""
    spec = RunSpec(impl="-", model=model, lr=0.1, steps=1, global_batch=2, seed=0, **run)
    return tuple(n for n, c in CHECKS.items() if c.applies(MODELS[model], spec)) + (AGREEMENT, TRANSPARENCY)


def evaluate_train(case, impl, runtime, w, session, overrides):
    """Verdicts of a ``train`` row (``overrides``: RunSpec fields, e.g. ``seed``, ``lr``, ``steps``)."""
    row = resolve_impl(impl)
    world = world_key(runtime, row.topology.get(runtime), w)
    where = world.where  # "pjrt", or "pjrt:spmd" for a topology world
    if MODELS[case.model].unsupported.get(where):  # the runtime cannot train it, whatever the DDP
        raise Unsupported(f"runtime {where}: {MODELS[case.model].unsupported[where]}")
    user = MODELS[case.model].user is not None  # --model: the run is the user's, its bound measured
    if user:
        spec = user_run(impl, case.model, **dict(case.train, **overrides))
        tol = measured_tolerance(session, runtime, w, spec)
        if tol is None:  # non-root process of a launcher-built world
            return None
    else:
        spec = RunSpec.from_table(runtime, impl, case.model, case.tolerance, **dict(case.train, **overrides))
        tol = lookup(runtime, case.model, case.tolerance)
    reps = session.trajectories(world, None, spec)
    if reps is None:
        return None
    groups = replica_groups(spec.setups, w)
    # One reference per data-parallel job: its first rank's seed, its own size.
    refs = [reference_run(replace(spec, seed=rank_seed(spec.seed, g[0])), len(g), world.world) for g in groups]
    out = []
    for name in case.checks:
        if name == TRANSPARENCY:  # of every replica, whatever job it belongs to
            out.append(judge_transparency(reps, case=case.name, impl=impl, runtime=runtime, model=case.model))
            continue
        if name == AGREEMENT and not row.holds_copies:
            out.append(Verdict(case.name, name, impl, runtime, case.model, w, "skip",
                               reason=f"{impl} {row.no_copies_reason}"))
            continue
        per_group = []
        for g, ref in zip(groups, refs):
            # one job: every trajectory (an SPMD program returns one for its W devices)
            mine = reps if len(groups) == 1 else [reps[r] for r in g]
            if name == AGREEMENT and len(g) < MIN_WORLD_SIZE and len(groups) > 1:
                continue  # a singleton group has nobody to agree with; its parity is still checked
            if name == AGREEMENT:
                v = judge_agreement(mine, case=case.name, impl=impl, runtime=runtime, model=case.model,
                                    atol=lookup(runtime, case.model, "agreement").atol)
            else:
                v = judge(CHECKS[name], mine, ref, tol, case=case.name, impl=impl, runtime=runtime,
                          model=case.model, world_size=w)
                if user:
                    v = stated(v, tol)
            per_group.append(v if len(groups) == 1 else in_group(v, g, w))
        out.append(worst(per_group))
    return out


#: Verdict statuses from worst to best: the verdict of a check over several groups is its worst.
_ORDER = BAD + ("pass",)


def worst(verdicts: list) -> Verdict:
    """The verdict of a check over several data-parallel jobs: the worst status, then the
    smallest margin."""
    return min(verdicts, key=lambda v: (_ORDER.index(v.status) if v.status in _ORDER else len(_ORDER),
                                        v.margin if v.margin == v.margin else float("inf")))


_REPLICAS = re.compile(r"(\b[Rr]eplica(?:s|\(s\))? )(\d+(?:, \d+)*)")


def in_group(v: Verdict, group: list, world_size: int) -> Verdict:
    """``v``, judged on the replicas of ``group`` (numbered 0.. within it), renamed to global
    ranks and prefixed ``process group [2, 3]: `` (a verdict must name the group)."""
    def glob(m):
        return m.group(1) + ", ".join(str(group[int(i)]) for i in m.group(2).split(", "))
    v.world_size = world_size
    if v.replica is not None:
        v.replica = group[v.replica]
    elif len(group) == 1 and v.status == "fail":
        v.replica = group[0]
    if v.reason:
        v.reason = f"process group {group}: " + _REPLICAS.sub(glob, v.reason)
    if v.diagnosis:
        v.diagnosis = f"process group {group}:\n" + _REPLICAS.sub(glob, v.diagnosis)
    return v


def requires_train(case) -> tuple:
    """The DDP keywords and methods a ``train`` row needs honoured: its own, then its setups'."""
    return tuple(case.train.get("requires", ())) + tuple(r for s in case.train.get("setups", ())
                                                         for r in SETUPS[s].requires)


def uses_train(case) -> tuple:
    """``("sync_bn",)`` when a setup of the row trains a SyncBatchNorm (the implementation's), else ``()``."""
    return ("sync_bn",) if any(SETUPS[s].reference.get("sync_bn") for s in case.train.get("setups", ())) else ()


KIND = Kind("train", evaluate_train, checks=lambda case: train_checks(case.model, case.train),
            requires=requires_train, uses=uses_train)
