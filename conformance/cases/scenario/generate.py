"""Generation: the Hypothesis strategies of scenarios (a :class:`Space`) and the tolerance and
shrinking helpers of the case runner (the explicit scenarios every run includes: :mod:`.explicit`)."""
from __future__ import annotations

from dataclasses import dataclass, fields
import copy

from conformance.cases.scenario.dimensions import (BRANCHES, EVAL_GRAD, EVAL_MODE, LOOPS, MAX_FORWARDS, MODULES,
                                                   PLAIN_MODULE, PLAIN_WORKLOAD, PYTREE_LEAF_OUTPUTS, SHORT_RUN_DTYPES, SPARSE_OPTIMIZERS, WORKLOADS,
                                                   XLA_UNSUPPORTED, XLA_UNSUPPORTED_LOOP)
from conformance.cases.scenario.format import Scenario
from conformance.cases.scenario.buckets import CAP_CLASSES, cap_mb, grad_bytes
from conformance.cases.scenario.model import build_scenario_model
from conformance.cases.scenario.statements import plain_where_refused
from conformance.cases.scenario.topology import MAX_NODES, RETURNS, needs, topologies
from conformance.cases.shared.loop import ALL_OPTIMIZERS, OPTIMIZERS
from conformance.tolerances import lookup


#: Learning rates per optimizer: large enough that one step moves parameters by
#: >= 100 x atol (the vacuity guard), small enough to stay stable for 120 steps.
LRS = {"sgd": (0.05, 0.1, 0.2), "sgd_momentum": (0.02, 0.05), "adam": (0.005, 0.01), "adamw": (0.005, 0.01),
       "sgd_wd": (0.1, 0.2)}


@dataclass(frozen=True)
class Space:
    """What a scenario case draws from (a row's ``args["space"]``)."""

    optimizers: tuple = OPTIMIZERS
    ddp_extra: tuple = ()        # ("buckets",) and/or ("comm_hook",)
    max_steps: int = 120
    budget: float = 1.0          # fraction of the profile's example budget (conformance.cases.shared.search)
    rank_uniform: bool = False   # equal local batches and plans on every replica (XLA runtimes)
    few_shapes: bool = False     # local batches from FEW_BATCHES (each distinct graph a compilation)
    workload: bool = False       # draw the workload (WORKLOADS) too; else the plain one
    xla_corners: bool = False    # draw only the corners XLA runtimes train (not XLA_UNSUPPORTED)
    loop: bool = False           # draw the loop program (LOOPS, forwards without backward, synced
    #                              backwards), and the default optimizers include sgd_wd (ALL_OPTIMIZERS)
    max_pattern: int = 4         # the most distinct steps a run repeats (a loop case: the profile's loop_depth)
    exclude: tuple = ()          # (field, key, value) statements not drawn: a replica crashed on them (.crashes)
    topology: bool = False       # train a generated module graph (conformance.cases.scenario.topology)
    max_nodes: int = 6           # the most hidden nodes of a drawn topology (1..MAX_NODES - 3)


#: Local batch sizes of generated scenarios where each distinct graph is compiled (XLA):
#: few, so graphs repeat across examples; 1 and more than 1 as in the full draw (1..6).
FEW_BATCHES = (1, 4)

#: Plans of generated scenarios where each distinct graph is compiled (XLA), first the plain one:
#: registration order and its reverse (hook order), and with ``find_unused_parameters`` a
#: branch left out, two, and all three (unused parameters) - each kind of the full draw, few graphs.
FEW_PLANS = (("a", "b", "c"), ("c", "b", "a"))
FEW_UNUSED_PLANS = (("a", "b"), ("c",), ())

#: ``Space.ddp_extra`` values -> the DDP keywords / methods their scenarios require.
DDP_EXTRAS = {"buckets": ("bucket_cap_mb", "gradient_as_bucket_view"), "comm_hook": ("register_comm_hook",),
              "static_graph": ("static_graph",), "keywords": ()}
#: ``keywords``: the DDP keywords of torch 2.13 drawn at each value class, the default first (the
#: shrink target). Each scenario requires the ones it passes (``init_sync``, ``forward_sync_buffers``;
#: the performance switches are dropped where refused, see ``conformance.cases.shared.step.PERFORMANCE_HINTS``).
KEYWORD_VALUES = {"init_sync": (True, False), "broadcast_buffers": (True, None, False),
                  "forward_sync_buffers": (None, True, False), "batched_grad_copy": (False, True)}
#: ``bucket_cap_mb_list``: up to this many per-bucket caps, each a class of CAP_CLASSES (the first
#: is the first bucket's size).
MAX_CAP_LIST = 3


def allowed(space: Space, field: str, key: str, values) -> list:
    """``values`` of dimension ``field.key`` without those ``space.exclude`` names (all of them if
    it names every one: the scenario is then left out when it runs, :func:`.crashes.excluded`)."""
    left = [v for v in values if (field, key, v) not in space.exclude]
    return left or list(values)


def space_problem(space: dict) -> str | None:
    """Why ``space`` (a scenario row's ``args["space"]``) is not a :class:`Space` the
    scenarios can be drawn from, or None."""
    known = [f.name for f in fields(Space)]
    unknown = sorted(set(space) - set(known))
    if unknown:
        return f"unknown key(s) {unknown}; known: {known}"
    sp = Space(**space)
    if set(sp.ddp_extra) - set(DDP_EXTRAS):
        return f"unknown ddp_extra {sorted(set(sp.ddp_extra) - set(DDP_EXTRAS))}; known: {sorted(DDP_EXTRAS)}"
    if not sp.optimizers or set(sp.optimizers) - set(ALL_OPTIMIZERS):
        return f"optimizers {sp.optimizers}: a non-empty subset of {ALL_OPTIMIZERS}"
    if not 1 <= sp.max_pattern <= 16:
        return f"max_pattern {sp.max_pattern}: 1..16 distinct steps"
    if sp.max_steps < 41:
        return f"max_steps {sp.max_steps}: at least 41 (long runs are drawn from 41..max_steps)"
    if not sp.budget > 0:
        return f"budget {sp.budget}: a positive fraction of the profile's example budget"
    if not (isinstance(sp.max_nodes, int) and 1 <= sp.max_nodes <= MAX_NODES - 3):
        return f"max_nodes {sp.max_nodes}: 1..{MAX_NODES - 3} hidden nodes of a topology"
    if sp.topology and sp.workload:
        return "topology and workload: a topology places the workload's corners at its own nodes"
    return None


def space_requires(space: dict) -> tuple:
    """The DDP keywords / methods the scenarios of ``space`` require (an implementation
    ignoring or lacking one is ``unsupported`` for the case)."""
    return tuple(k for extra in Space(**space).ddp_extra for k in DDP_EXTRAS[extra])


def scenarios(world_size: int, space: Space):
    """Hypothesis strategy of :class:`Scenario` for ``world_size`` replicas: a pattern of 1..4
    distinct optimizer steps repeated cyclically to the run's length (1..8, or one run in ten
    41..``max_steps``), so long runs stay cheap to draw and shrink. Everything shrinks towards the
    plain case: one step, one micro-step, equal batches of 1, every branch in the same order, SGD."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        workload = draw(workloads(space)) if space.workload else dict(PLAIN_WORKLOAD)
        topo = draw(topologies(space.max_nodes, reentrant="static_graph" in space.ddp_extra)) \
            if space.topology else None
        need = needs(topo) if topo else {"sparse": False, "reentrant": False, "reentrant_head": False, "bf16": False}
        sparse = workload["grad"] != "dense" or need["sparse"]
        optimizers = ALL_OPTIMIZERS if space.loop and space.optimizers == OPTIMIZERS else space.optimizers
        optimizer = draw(st.sampled_from([o for o in optimizers if not sparse or o in SPARSE_OPTIMIZERS]
                                         or list(optimizers)))
        find_unused = draw(st.booleans())
        ddp, keys = _draw_ddp(draw, space, workload, find_unused,
                              need["reentrant"] or (need["reentrant_head"] and find_unused),
                              free_static=not (topo and topo["returns"] in PYTREE_LEAF_OUTPUTS))
        static, skip_unused = keys["static"], keys["skip_unused"]
        # static_graph: one graph for the run, so one plan everywhere (all branches unless
        # find_unused_parameters); skip_all_reduce_unused_params too
        fixed = (draw(_plans(space, find_unused)) if find_unused else draw(st.permutations(BRANCHES).map(list))) \
            if static or skip_unused else None
        pattern = [_draw_step(draw, world_size, space, find_unused, static, fixed)
                   for _ in range(draw(st.integers(1, space.max_pattern)))]
        # One run in ten is long (faults that start late); the explicit scenarios hold one too.
        # (not with a bfloat16 part: its 1-ulp rounding flips compound over long runs, above any
        # bound a short run's movement clears)
        long_run = (draw(st.integers(0, 9)) == 9 and workload["dtype"] not in SHORT_RUN_DTYPES
                    and not need["bf16"])
        n = draw(st.integers(41, space.max_steps) if long_run else st.integers(1, 8))
        steps = [copy.deepcopy(pattern[i % len(pattern)]) for i in range(n)]
        ckpt = draw(st.one_of(st.none(), st.integers(0, max(0, n - 2)))) if n > 1 else None
        sc = Scenario(seed=draw(st.integers(0, 2 ** 20)), lr=draw(st.sampled_from(LRS[optimizer])),
                      optimizer=optimizer, ddp=ddp, rebind_buffers=draw(st.booleans()),
                      loss_scale_log2=draw(st.sampled_from([0, 8, 20])), checkpoint_at=ckpt, steps=steps,
                      workload=workload, topology=topo)
        if find_unused:  # UPSTREAM_DEFECTS ("enabled_forward", "no_sync"): not drawn
            _no_enabled_forward_before_no_sync(sc)
        if static and topo is not None and topo["returns"] in PYTREE_LEAF_OUTPUTS:  # UPSTREAM_DEFECTS: not drawn
            topo["returns"] = RETURNS[0]
        if space.loop:
            _draw_module_and_loop(draw, sc, n, space)
        if "buckets" in space.ddp_extra or keys["caps"]:
            _bucket_caps(sc, space, keys["cap"], keys["caps"])
        return sc
    return build()


def _plans(space: Space, find_unused: bool):
    """Strategy of one replica's plan: a permutation of the branches (with ``find_unused``: a
    prefix of one, maybe empty), or one of the few plans where graphs are compiled."""
    from hypothesis import strategies as st
    if space.few_shapes:
        return st.sampled_from(FEW_PLANS + (FEW_UNUSED_PLANS if find_unused else ())).map(list)
    perm = st.permutations(BRANCHES)
    if not find_unused:
        return perm.map(list)
    return st.tuples(perm, st.integers(0, len(BRANCHES))).map(lambda t: list(t[0][:t[1]]))


def _draw_ddp(draw, space: Space, workload: dict, find_unused: bool, reentrant: bool = False,
              free_static: bool = True) -> tuple:
    """``(ddp keywords, keys)``: the DDP keywords of :data:`DDP_EXTRAS` ``space.ddp_extra`` asks
    for; ``keys``: ``static`` (static_graph), ``skip_unused``, ``cap`` (the bucket cap class drawn,
    set once the model is known) and ``caps`` (the per-bucket cap classes, or None); ``reentrant``:
    the drawn topology needs ``static_graph`` (its reentrant checkpoints); ``free_static``:
    ``static_graph`` may be drawn where nothing needs it (not for an output pytree does not enter:
    :data:`UPSTREAM_DEFECTS`)."""
    from hypothesis import strategies as st
    ddp = {"find_unused_parameters": find_unused, "broadcast_buffers": not draw(st.booleans())}
    cap = None
    if "buckets" in space.ddp_extra:
        # a boundary of the model's own gradient sizes, computed once the model is drawn
        cap = (draw(st.sampled_from(CAP_CLASSES)), draw(st.integers(2, 6)))
        ddp["bucket_cap_mb"] = None
        ddp["gradient_as_bucket_view"] = draw(st.booleans())
    if "comm_hook" in space.ddp_extra:
        ddp["comm_hook"] = "allreduce"
    static = False
    if "static_graph" in space.ddp_extra:  # upstream needs it for a reentrant checkpoint
        static = workload["graph"] == "checkpoint_reentrant" or reentrant or (free_static and draw(st.booleans()))
        ddp["static_graph"] = static
    skip_unused, caps = False, None
    if "keywords" in space.ddp_extra:
        ddp.update({k: draw(st.sampled_from(allowed(space, "ddp", k, v))) for k, v in KEYWORD_VALUES.items()})
        if draw(st.booleans()):
            caps = draw(st.lists(st.tuples(st.sampled_from(CAP_CLASSES), st.integers(2, 6)),
                                 min_size=1, max_size=MAX_CAP_LIST))
        # torch requires the same unused parameters on every replica throughout: one plan
        skip_unused = draw(st.booleans())
        ddp["skip_all_reduce_unused_params"] = skip_unused
    return ddp, {"static": static, "skip_unused": skip_unused, "cap": cap, "caps": caps}


def _draw_step(draw, world_size: int, space: Space, find_unused: bool, static: bool, fixed) -> dict:
    """One distinct step of a run's pattern: its accumulation window (every replica's batch and
    plan; ``fixed``: the one plan of a static graph) and, for a loop program, its synced backwards,
    forwards per backward and forwards without backward."""
    from hypothesis import strategies as st
    # static_graph with a no_sync window crashes torch's DDP (UPSTREAM_DEFECTS): not drawn
    k = 1 if static else draw(st.integers(1, 3))
    micro = []
    for _ in range(k):
        if space.few_shapes:
            batch = [draw(st.sampled_from(FEW_BATCHES))] * world_size
            plans = [draw(_plans(space, find_unused))] * world_size
        elif space.rank_uniform:
            batch = [draw(st.integers(1, 6))] * world_size
            plans = [draw(_plans(space, find_unused))] * world_size
        else:
            batch = [draw(st.integers(1, 6)) for _ in range(world_size)]
            plans = [draw(_plans(space, find_unused)) for _ in range(world_size)]
        if fixed is not None:
            plans = [list(fixed) for _ in range(world_size)]
        micro.append({"batch": batch, "plan": plans})
    step = {"micro": micro}
    if space.loop:  # the loop program: synced backwards and forwards without backward
        for m in micro[:-1]:
            if not static and draw(st.booleans()):
                m["sync"] = True
        for m in micro:  # a GAN's discriminator: forwards on fake and real, one backward
            if not static and draw(st.integers(0, 2)) == 2:
                m["forwards"] = draw(st.integers(2, MAX_FORWARDS))
        evals = draw(st.lists(_eval_forwards(world_size, space, len(micro)), max_size=2))
        if evals:
            step["eval"] = evals
    return step


def _eval_forwards(world_size: int, space: Space, k: int):
    """Strategy of one forward without backward before micro-step ``0..k``."""
    from hypothesis import strategies as st
    if space.few_shapes:
        batch = st.sampled_from(FEW_BATCHES).map(lambda n: [n] * world_size)
    elif space.rank_uniform:
        batch = st.integers(1, 6).map(lambda n: [n] * world_size)
    else:
        batch = st.lists(st.integers(1, 6), min_size=world_size, max_size=world_size)
    grads = [g for g in EVAL_GRAD if not (space.xla_corners and ("eval", g) in XLA_UNSUPPORTED_LOOP)]
    return st.fixed_dictionaries({"at": st.integers(0, k), "grad": st.sampled_from(grads),
                                  "mode": st.sampled_from(EVAL_MODE), "batch": batch})


def _draw_module_and_loop(draw, sc: Scenario, n: int, space: Space) -> None:
    """A loop program's module (:data:`MODULES`) and loop (:data:`LOOPS`) dimensions into ``sc``
    (``n`` steps), where :meth:`Scenario.validate` would refuse the combination the next value."""
    from hypothesis import strategies as st
    workload = sc.workload
    sc.module = {k: draw(st.sampled_from(allowed(space, "module", k, v))) for k, v in MODULES.items()} \
        if sc.topology is None else dict(PLAIN_MODULE)
    if workload["graph"] == "shared" or workload["layout"] == "transposed":  # validate says why
        sc.module["parametrize"] = "none"
    sc.loop = dict({k: draw(st.sampled_from(allowed(space, "loop", k, v))) for k, v in LOOPS.items()},
                   lr_drop_at=draw(st.one_of(st.none(), st.integers(1, n - 1))) if n > 1 else None)
    plain_where_refused(sc)  # a statement that cannot go with the rest (validate says why)
    if sc.rebind_buffers:  # rebound buffers cannot be made under inference_mode (validate says why)
        for step in sc.steps:
            for f in step.get("eval", ()):
                if f["mode"] == "train" and f["grad"] == "inference_mode":
                    f["grad"] = "no_grad"


def _bucket_caps(sc: Scenario, space: Space, cap, caps) -> None:
    """The drawn bucket cap classes made caps of ``sc``'s own model's gradient sizes."""
    sizes = grad_bytes(build_scenario_model(sc.seed, sc.rebind_buffers, 0.0, sc.workload, sc.module, sc.topology))
    if "buckets" in space.ddp_extra:
        sc.ddp["bucket_cap_mb"] = cap_mb(sizes, *cap)
    if caps:
        sc.ddp["bucket_cap_mb_list"] = [cap_mb(sizes, *c) for c in caps]


def _no_enabled_forward_before_no_sync(sc: Scenario) -> None:
    """Turn a grad-enabled forward without backward whose next training forward (of the same DDP)
    runs under ``no_sync()`` into a ``no_grad`` one: torch's DDP with ``find_unused_parameters``
    fails that loop (:data:`UPSTREAM_DEFECTS`)."""
    for s, step in enumerate(sc.steps):
        for f in step.get("eval", ()):
            if f["grad"] != "enabled":
                continue
            if f["at"] < len(step["micro"]):
                nxt = (s, f["at"])
            else:
                nxt = (s + 1, 0) if s + 1 < len(sc.steps) and sc.checkpoint_at != s else None
            if nxt is not None and not sc.synced(*nxt):
                f["grad"] = "no_grad"


def workloads(space: Space):
    """Hypothesis strategy of workloads (:data:`WORKLOADS`), each dimension drawn apart; with
    ``space.xla_corners`` only the corners XLA runtimes train, without the ``static_graph`` DDP
    extra no reentrant checkpoint (upstream needs ``static_graph`` for it)."""
    from hypothesis import strategies as st

    def dimension(k):
        vals = [v for v in allowed(space, "workload", k, WORKLOADS[k])
                if not (space.xla_corners and (k, v) in XLA_UNSUPPORTED)]
        if "static_graph" not in space.ddp_extra:
            vals = [v for v in vals if v != "checkpoint_reentrant"]
        return st.sampled_from(vals)
    return st.fixed_dictionaries({k: dimension(k) for k in WORKLOADS})


def scenario_tolerance(runtime: str, sc: Scenario):
    """The tolerance row of ``sc``'s workload dtype (``conformance.tolerances``: model
    ``scenario``; complex64 is float32 precision)."""
    if sc.topology is not None:
        return lookup(runtime, "scenario", needs(sc.topology)["tolerance"])
    return lookup(runtime, "scenario", WORKLOAD_TOLERANCE.get(sc.workload["dtype"], "float32"))


#: Workload dtypes with their own tolerance row (the others: ``float32``).
WORKLOAD_TOLERANCE = {"float64": "float64", "bfloat16": "bf16-mixed"}


def judged_on(sc, vs: list, first_sc, first_vs: list, worst: dict, examples: int) -> list:
    """``[(verdict, scenario it was judged on or None)]`` for a failing scenario case. Shrinking
    keeps what fails, not what trains: a check ``vacuous`` on the minimal failing scenario ``sc``
    takes its verdict over the passing scenarios (``worst``; None), else on the first, unshrunk
    failing scenario when that one is not vacuous; else it stays vacuous."""
    out = []
    for v in vs:
        if v.status == "vacuous" and v.check in worst:
            w = worst[v.check]
            w.reason = (f"{examples} scenario(s) judged; the minimal failing scenario moved too "
                        "little to judge this check")
            out.append((w, None))
            continue
        if v.status == "vacuous":
            first = next(u for u in first_vs if u.check == v.check)
            if first.status != "vacuous":
                out.append((first, first_sc))
                continue
        out.append((v, sc))
    return out
