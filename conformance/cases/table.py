"""The case table: every conformance case the kit runs, in one validated table.

One row (in the spirit of PyTorch's OpInfo) per case: parity on a model, a DDP
feature, a Hypothesis property, a rank invariant (and generated scenarios).
Every face - the CLI, the pytest plugin, the absltest face, the kill matrix,
``calibrate``, ``run --repeat``, the JSON and HTML reports - iterates this table
through :func:`conformance.evaluate.evaluate`.

A row says how it is evaluated (``kind``):

* ``train`` - the standard training loop (:func:`conformance.cases.train.loop.train_replica`)
  with the row's run overrides and setups (``run``), judged against the
  single-device reference by the check table and by replica agreement;
* ``task`` - the row's own replica task and judge (``task``, ``judge``);
* ``property`` - a Hypothesis property (:mod:`conformance.cases.properties.run`);
* ``invariant`` - the rank-binding invariants of the world;
* ``scenario`` - generated training scenarios (:mod:`conformance.cases.scenarios.scenario`):
  explicit ones, then Hypothesis-drawn ones, against the DDP-semantics oracle.

``must_kill`` names the catalog mutants the case must fail: the only place the
mutant <-> case relation is stored. The table is validated when built: a
duplicate name, an unknown model, tolerance key, setup or mutant, or a mutant
no case must kill raises ``ValueError`` naming the row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

#: Case families (also tags).
FAMILIES = ("parity", "feature", "property", "invariant", "scenario")
KINDS = ("train", "task", "property", "invariant", "scenario")


@dataclass(frozen=True)
class Case:
    """One row of the case table.

    Attributes:
        name: unique id, ``<family>.<name>`` (e.g. ``feature.no_sync``).
        family: one of :data:`FAMILIES`.
        description: what a conforming DDP does, one sentence.
        kind: how it is evaluated (see the module docstring).
        model: the model (``fixtures.models.MODELS``) or ``"-"``.
        tolerance: the tolerance key: a dtype row of ``conformance.tolerances``
            (``float32``, ``bf16-autocast``, ``exact``) or ``grad`` (the
            gradient tolerances of the properties).
        run: for ``train``: RunSpec overrides (``setups``, ``ddp_kwargs``,
            ``requires``, ``momentum``, ``broadcast_buffers``...).
        task / judge: for ``task``: ``task(ctx, impl, **args) -> dict`` on every
            replica, ``judge(results, impl, runtime) -> list[Verdict]``.
        args: keyword arguments of ``task``.
        prop: for ``property``: the property name.
        checks: the check names the case reports (one verdict each, whatever
            the outcome, so verdict ids are stable).
        tags: extra selection tags (feature names); the family, the model and
            the name are tags too (see :attr:`all_tags`).
        must_kill: catalog mutants this case must fail.
        skips: ``{runtime | impl | "runtime/impl": reason}``: where the case
            cannot run, with the reason (a ``skip`` verdict).
        timeout: bound on one world task in seconds (``None``: the world's).
    """

    name: str
    family: str
    description: str
    kind: str
    model: str = "-"
    tolerance: str = "float32"
    run: dict = field(default_factory=dict)
    task: Callable | None = None
    judge: Callable | None = None
    args: dict = field(default_factory=dict)
    prop: str = ""
    checks: tuple = ()
    tags: tuple = ()
    must_kill: tuple = ()
    skips: dict = field(default_factory=dict)
    timeout: float | None = None

    @property
    def all_tags(self) -> frozenset:
        return frozenset((self.name, self.family, self.model, self.name.split(".", 1)[-1]) + tuple(self.tags)) - {"-"}

    def skip_reason(self, runtime: str, impl: str) -> str | None:
        for key in (f"{runtime}/{impl}", impl, runtime):
            if key in self.skips:
                return self.skips[key]
        return None


def _train_checks(model: str, run: dict) -> tuple:
    from fixtures.models import MODELS

    from conformance.cases.checks import AGREEMENT, CHECKS
    from conformance.cases.train.loop import RunSpec
    spec = RunSpec(impl="-", model=model, lr=0.1, steps=1, global_batch=2, seed=0, **run)
    return tuple(n for n, c in CHECKS.items() if c.applies(MODELS[model], spec)) + (AGREEMENT,)


def _parity(model, must_kill, description=None):
    return Case(f"parity.{model}", "parity", description or f"training {model} with the DDP equals "
                "training on one device with the global batch, step by step; replicas agree bit for bit",
                "train", model, must_kill=must_kill)


def _feature_train(name, description, model, run, must_kill, tolerance="float32", tags=()):
    return Case(f"feature.{name}", "feature", description, "train", model, tolerance=tolerance, run=run,
                tags=(name,) + tags, must_kill=must_kill)


def _feature_task(name, description, model, task, judge, checks, must_kill, tolerance="float32",
                  timeout=None, tags=()):
    return Case(f"feature.{name}", "feature", description, "task", model, tolerance=tolerance, task=task,
                judge=judge, checks=checks, tags=(name,) + tags, must_kill=must_kill, timeout=timeout)


def _property(name, description, must_kill):
    return Case(f"property.{name}", "property", description, "property", tolerance="grad", prop=name,
                checks=("property",), tags=("properties",), must_kill=must_kill)


def _scenario(name, description, space, must_kill, tags=()):
    return Case(f"scenario.{name}", "scenario", description, "scenario", "scenario", args={"space": space},
                checks=("params", "buffers", "optimizer_state", "agreement"), tags=("scenarios",) + tags,
                must_kill=must_kill)


def _build() -> dict[str, Case]:
    from conformance.cases import features as F
    P = ("no_grad_sync", "sum_not_mean", "wrong_count", "no_initial_broadcast", "last_param_unsynced",
         "scale_twice", "stale_gradient", "shard_mixup")
    # Faults of the shipped paths (conformance/impls/torch_paths.py): parity on a model without buffers
    # is where every target row runs.
    T = ("fsdp2_no_divide", "fsdp2_wrong_mesh", "zero_no_param_sync", "torch_compile_eager")
    rows = [
        _parity("linear", P + T),
        _parity("mlp", P + ("clip_local_grad",) + T),
        _parity("batchnorm", P + ("buffers_not_broadcast", "clip_local_grad")),
        _feature_task("state_sync", "replicas built from their own seeds differ before wrapping and hold "
                      "rank 0's parameters and buffers bit-identically after construction", "batchnorm",
                      F.task_state_sync, F.judge_state_sync, ("state_sync",), ("no_initial_broadcast",),
                      tolerance="exact"),
        _feature_task("broadcast_buffers_on", "broadcast_buffers=True: a buffer rank 0 changes is on every "
                      "replica after the next forward", "batchnorm", F.task_buffers_on, F.judge_buffers_on,
                      ("buffers",), ("buffers_not_broadcast",), tolerance="exact", tags=("broadcast_buffers",)),
        _feature_train("broadcast_buffers_off", "broadcast_buffers=False: buffers stay local and parity "
                       "holds with the matching reference", "batchnorm", {"broadcast_buffers": False},
                       ("buffers_always_broadcast",), tags=("broadcast_buffers",)),
        _feature_task("unused_parameters", "find_unused_parameters=True: a globally unused parameter keeps "
                      "grad None; a locally unused one is reduced as zeros", "unused", F.task_unused,
                      F.judge_unused, ("grads",), ("unused_zero_filled", "unused_skipped")),
        _feature_task("no_sync", "inside no_sync gradients stay local; the next synced backward reduces "
                      "the accumulated gradients", "linear", F.task_no_sync, F.judge_no_sync,
                      ("inside", "after"), ("no_sync_ignored", "no_sync_sticky")),
        _feature_train("bucket_view", "gradient_as_bucket_view=True with many small buckets keeps parity",
                       "mlp", {"ddp_kwargs": (("gradient_as_bucket_view", True), ("bucket_cap_mb", 0.25)),
                               "requires": ("gradient_as_bucket_view", "bucket_cap_mb")},
                       ("dropped_bucket",), tags=("buckets",)),
        _feature_train("static_graph", "static_graph=True keeps parity", "mlp",
                       {"ddp_kwargs": (("static_graph", True),), "requires": ("static_graph",)},
                       ("static_graph_stale",)),
        _feature_task("join", "uneven inputs under join(): no hang, and parameters equal the reference "
                      "with upstream's divide-by-initial-world-size semantics", "linear", F.task_join,
                      F.judge_join, ("params",), ("join_dropped",), timeout=F.JOIN_TIMEOUT_S),
        _feature_train("comm_hook", "a registered plain-averaging comm hook equals the default", "linear",
                       {"setups": ("comm_hook_allreduce",)}, ("comm_hook_no_divide",)),
        _feature_train("sync_batchnorm", "SyncBatchNorm over replicas equals BatchNorm on the global batch "
                       "(parameters, loss, running stats)", "batchnorm", {"setups": ("sync_bn",)},
                       ("sync_bn_local_stats",)),
        _feature_train("mixed_precision", "bfloat16 autocast forward keeps parity at the bf16 tolerance",
                       "linear", {"setups": ("autocast_bf16",)}, ("wrong_count",),
                       tolerance="bf16-autocast"),
        _feature_train("checkpoint_ddp", "state_dict of the DDP wrapper ('module.' prefix) saved mid-run "
                       "and reloaded gives the uninterrupted trajectory; optimizer state equal on all "
                       "replicas", "batchnorm", {"setups": ("checkpoint_ddp",), "momentum": 0.9},
                       ("state_dict_drops_buffers",), tags=("checkpoint",)),
        _feature_train("checkpoint_module", "the same with the inner module's state_dict (no prefix)",
                       "batchnorm", {"setups": ("checkpoint_module",), "momentum": 0.9},
                       ("stale_gradient",), tags=("checkpoint",)),
        _feature_train("checkpoint_resume", "the DDP wrapper's and optimizer's state_dicts loaded back into "
                       "the same live objects mid-run (a rollback) continue the uninterrupted trajectory",
                       "linear", {"setups": ("checkpoint_resume",), "momentum": 0.9}, ("load_assigns",),
                       tags=("checkpoint",)),
        _feature_train("frozen_params", "parameters with requires_grad=False stay frozen; parity holds",
                       "frozen", {}, ("unfreezes_params",)),
        _feature_train("tied_weights", "tied (shared) weights stay tied; parity holds", "tied", {},
                       ("unties_shared_weights",)),
        _property("allreduce_mean", "a gradient pushed through the DDP comes back as the replicas' mean, "
                  "bit-identical on every replica, within a rounding-error bound of the exact mean",
                  ("sum_not_mean",)),
        _property("full_batch_grad", "synced gradients of random MLPs equal the single-device gradient "
                  "on the global batch", ("no_grad_sync",)),
        _property("rank_permutation", "permuting which replica gets which shard leaves the synced "
                  "gradients unchanged", ("last_param_unsynced",)),
        _property("broadcast", "construction makes every replica hold rank 0's parameters and buffers "
                  "bit-identically; constructing again changes nothing", ("no_initial_broadcast",)),
        _property("no_sync_accumulation", "k no_sync micro-steps + one synced step give the sum of the "
                  "micro-batches' global-batch gradients", ("no_grad_sync",)),
        _property("scale_linearity", "scaling every replica's loss by c scales the synced gradient by c",
                  ("clip_local_grad",)),
        _scenario("core", "generated runs: uneven local batches, accumulation windows, rank-dependent "
                  "branches and hook order, unused parameters, buffer rebinding, loss scale, checkpoint "
                  "reload, SGD/momentum/Adam/AdamW, up to 120 steps; every step equals DDP's semantics "
                  "on one device and replicas agree bit for bit", {},
                  ("no_grad_sync", "sum_not_mean", "unused_accum_dropped", "arrival_order_pairing",
                   "cached_buffer_list", "replica_drift", "late_desync", "batch_weighted",
                   "fp16_allreduce")),
        _scenario("buckets", "the same with small gradient buckets and gradient_as_bucket_view",
                  {"ddp_extra": ("buckets",), "budget": 0.5}, ("dropped_bucket",), tags=("buckets",)),
        _scenario("comm_hook", "the same with torch's all-reduce comm hook registered",
                  {"ddp_extra": ("comm_hook",), "budget": 0.5}, ("comm_hook_no_divide",), tags=("comm_hook",)),
        Case("invariant.ranks", "invariant", "every replica's rank bindings satisfy the invariants "
             "(global ordinals 0..W-1, process indices 0..P-1, local ordinals per host, "
             "torch.distributed rank = process index)", "invariant", tolerance="exact",
             checks=("ranks",), tags=("ranks",)),
    ]
    return _validate(rows)


def _validate(rows: list[Case]) -> dict[str, Case]:
    from fixtures.models import MODELS

    from conformance.impls.mutants.catalog import MUTANTS
    from conformance.cases.train.setups import SETUPS
    from conformance.tolerances import TOLERANCES
    keys = {t.dtype for t in TOLERANCES} | {"grad"}
    table: dict[str, Case] = {}
    for c in rows:
        def bad(why):
            return ValueError(f"case table: row {c.name!r}: {why}")
        if c.name in table:
            raise bad("duplicate name")
        if c.family not in FAMILIES or not c.name.startswith(c.family + "."):
            raise bad(f"family {c.family!r} must be one of {FAMILIES} and prefix the name")
        if c.kind not in KINDS:
            raise bad(f"unknown kind {c.kind!r}")
        if c.model not in ("-", "scenario") and c.model not in MODELS:
            raise bad(f"unknown model {c.model!r}")
        if c.tolerance not in keys:
            raise bad(f"unknown tolerance key {c.tolerance!r}; known: {', '.join(sorted(keys))}")
        unknown = [m for m in c.must_kill if m not in MUTANTS]
        if unknown:
            raise bad(f"unknown mutant(s) {unknown}")
        unknown = [s for s in c.run.get("setups", ()) if s not in SETUPS]
        if unknown:
            raise bad(f"unknown setup(s) {unknown}")
        if c.kind == "train":
            object.__setattr__(c, "checks", _train_checks(c.model, c.run))
        elif c.kind == "task" and (c.task is None or c.judge is None):
            raise bad("a task case needs task and judge")
        if not c.checks:
            raise bad("no checks")
        table[c.name] = c
    orphans = sorted(set(MUTANTS) - {m for c in rows for m in c.must_kill})
    if orphans:
        raise ValueError(f"case table: mutant(s) {orphans} are killed by no case (add them to a row's must_kill)")
    return table


CASES: dict[str, Case] = _build()


def all_tags() -> frozenset:
    """Every tag that selects something (``--only`` / ``--skip`` accept these)."""
    return frozenset().union(*(c.all_tags for c in CASES.values()))


def select(only=(), skip=()) -> list[Case]:
    """Rows carrying a tag of ``only`` (all rows if empty) and none of ``skip``.

    Raises:
        UsageError: a tag that selects nothing (the message lists the families).
    """
    from conformance.errors import UsageError
    known = all_tags()
    for opt, tags in (("--only", only), ("--skip", skip)):
        unknown = [t for t in tags if t not in known]
        if unknown:
            raise UsageError(f"{opt}: unknown tag(s) {', '.join(unknown)}; use a family "
                             f"({', '.join(FAMILIES)}), a model, a feature or a case name")
    return [c for c in CASES.values()
            if (not only or c.all_tags & set(only)) and not (c.all_tags & set(skip))]


def cases_killing(mutant: str) -> list[Case]:
    """Rows whose ``must_kill`` names ``mutant``."""
    return [c for c in CASES.values() if mutant in c.must_kill]
