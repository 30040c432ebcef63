"""The scenario format: the JSON data of one scenario (:class:`Scenario`), its keys, and the
validation of a file against the dimension tables it was drawn from (:mod:`.dimensions`).

What a scenario is and how it is judged: :mod:`conformance.cases.scenario.kind`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
import json
import math

from conformance.cases.scenario.dimensions import (BRANCHES, EVAL_GRAD, EVAL_MODE, LOOP_PHRASES, LOOPS, LR_DROP,
                                                   MAX_FORWARDS, MODULE_PHRASES, MODULES, PLAIN_LOOP, PLAIN_MODULE,
                                                   PLAIN_WORKLOAD, SPARSE_OPTIMIZERS, WORKLOAD_PHRASES, WORKLOADS,
                                                   workload_corners)
from conformance.cases.scenario.statements import problems as statement_problems
from conformance.cases.scenario.topology import TopologyError, describe, needs, validate_topology
from conformance.cases.shared.loop import ALL_OPTIMIZERS

SCENARIO_KEYS = {"seed", "lr", "optimizer", "ddp", "rebind_buffers", "loss_scale_log2", "checkpoint_at",
                 "steps", "workload", "loop", "module", "topology"}
#: Scenario keys a JSON file may leave out (older files: the plain workload, loop and module; the
#: scenario model rather than a generated topology).
OPTIONAL_KEYS = {"workload", "loop", "module", "topology"}
#: torch's default of each DDP keyword a scenario may hold: a scenario passes the others to the DDP.
DDP_DEFAULTS = {"find_unused_parameters": False, "broadcast_buffers": None, "bucket_cap_mb": None,
                "gradient_as_bucket_view": False, "static_graph": False, "init_sync": True,
                "forward_sync_buffers": None, "batched_grad_copy": False, "bucket_cap_mb_list": None,
                "skip_all_reduce_unused_params": False}
#: The DDP keywords a scenario may hold (``comm_hook``: ``"allreduce"``, registered after wrapping).
DDP_KEYS = set(DDP_DEFAULTS) | {"comm_hook"}
#: Keywords whose value must be a bool (those of a bool default), or a bool or None.
BOOL_KEYS = tuple(k for k, v in DDP_DEFAULTS.items() if isinstance(v, bool))
OPTIONAL_BOOL_KEYS = ("broadcast_buffers", "forward_sync_buffers")


def buffer_sync(ddp: dict) -> tuple[bool, bool]:
    """``(at construction, before a forward)``: whether the DDP keywords ``ddp`` broadcast rank
    0's buffers then, as torch 2.13's ``DistributedDataParallel.__init__`` decides:
    ``forward_sync_buffers`` (None: follow ``broadcast_buffers``) rules the forward sync and
    leaves the construction sync on; ``broadcast_buffers=False`` (deprecated) turns both off;
    ``init_sync=False`` skips the whole construction sync (parameters too)."""
    bcast = ddp.get("broadcast_buffers")
    bcast = True if bcast is None else bcast
    fwd = ddp.get("forward_sync_buffers")
    at_forward = bcast if fwd is None else fwd
    at_init = bool(ddp.get("init_sync", True)) and (fwd is not None or bcast)
    return at_init, at_forward


STEP_KEYS = {"micro"}
#: Keys a step may add (the loop programs): forwards without backward before its micro-steps.
STEP_OPTIONAL = {"eval"}
MICRO_KEYS = {"batch", "plan"}
#: Keys a micro-step may add: ``sync`` (default: only the window's last micro-step is synced,
#: the others run under ``no_sync()``; true: a synced backward of its own); ``forwards``
#: (default 1): how many forwards through the DDP, each on its own data, before the micro-step's
#: one backward of their summed losses (a GAN discriminator on fake and real batches).
MICRO_OPTIONAL = {"sync", "forwards"}

#: Keys of a forward without backward (a step's ``eval`` entry, :data:`~.dimensions.EVAL_GRAD`).
EVAL_KEYS = {"at", "grad", "mode", "batch"}


class ScenarioError(ValueError):
    """A scenario that does not parse or names an unknown dimension; one line."""


@dataclass
class Scenario:
    """One scenario (what it is: :mod:`conformance.cases.scenario.kind`).

    Attributes:
        seed: model and data seed.
        lr: learning rate.
        optimizer: one of :data:`~conformance.cases.shared.loop.ALL_OPTIMIZERS`.
        ddp: DDP keywords (subset of :data:`DDP_KEYS`; ``comm_hook``: ``"allreduce"``).
        rebind_buffers: the model assigns new tensors to its buffers in forward.
        loss_scale_log2: the loss is multiplied by ``2**loss_scale_log2`` before backward and the
            synced gradient divided by it before the step (exact: a power of two).
        checkpoint_at: after this step (0-based) save and reload DDP + optimizer state (or None).
        steps: ``[{"micro": [{"batch": [n_0, ..., n_{W-1}], "plan": [[branch, ...] per replica]}]}]``.
        workload: ``{dimension: value}`` of :data:`~.dimensions.WORKLOADS` (a file without it: plain).
        loop: ``{dimension: value}`` of :data:`~.dimensions.LOOPS` plus ``lr_drop_at`` (a file
            without it: :data:`~.dimensions.PLAIN_LOOP`). A step may hold ``"eval"`` (:data:`EVAL_KEYS`)
            and a micro-step ``"sync"`` and ``"forwards"`` (:data:`MICRO_OPTIONAL`).
        module: ``{dimension: value}`` of :data:`~.dimensions.MODULES` (a file without it: plain).
        topology: a generated module graph (:mod:`.topology`) trained instead of the scenario
            model (None: the scenario model); its workload and module are the plain ones.
    """

    seed: int
    lr: float
    optimizer: str
    ddp: dict
    rebind_buffers: bool
    loss_scale_log2: int
    checkpoint_at: int | None
    steps: list = field(default_factory=list)
    workload: dict = field(default_factory=lambda: dict(PLAIN_WORKLOAD))
    loop: dict = field(default_factory=lambda: dict(PLAIN_LOOP))
    module: dict = field(default_factory=lambda: dict(PLAIN_MODULE))
    topology: dict | None = None

    @property
    def world_size(self) -> int:
        return len(self.steps[0]["micro"][0]["batch"])

    def to_json(self) -> dict:
        """The scenario as JSON data; a plain loop is left out (files stay as before the loop axis)."""
        d = asdict(self)
        if self.loop == PLAIN_LOOP:
            del d["loop"]
        if self.module == PLAIN_MODULE:
            del d["module"]
        if self.topology is None:
            del d["topology"]
        return d

    def synced(self, s: int, j: int) -> bool:
        """Whether micro-step ``j`` of step ``s`` (0-based) runs a synced backward."""
        micro = self.steps[s]["micro"]
        return micro[j].get("sync", j == len(micro) - 1)

    def forwards(self, s: int, j: int) -> int:
        """How many forwards micro-step ``j`` of step ``s`` runs before its one backward."""
        return self.steps[s]["micro"][j].get("forwards", 1)

    def evals(self, s: int, at: int) -> list:
        """``[(e, forward)]``: the forwards without backward of step ``s`` run before micro-step
        ``at``, with their index ``e`` in the step."""
        return [(e, f) for e, f in enumerate(self.steps[s].get("eval", ())) if f["at"] == at]

    def lr_at(self, s: int) -> float:
        """The learning rate of step ``s`` (0-based)."""
        drop = self.loop["lr_drop_at"]
        return self.lr * (LR_DROP if drop is not None and s >= drop else 1.0)

    @classmethod
    def from_json(cls, d) -> "Scenario":
        """Parse and validate (a failure file's ``"scenario"`` too).

        Raises:
            ScenarioError: not an object, an unknown or missing key (dimension), or a bad value.
        """
        if not isinstance(d, dict):
            raise ScenarioError("a scenario is a JSON object")
        if "scenario" in d and isinstance(d["scenario"], dict):  # a failure file wraps it
            d = d["scenario"]
        unknown = sorted(set(d) - SCENARIO_KEYS)
        if unknown:
            raise ScenarioError(f"unknown scenario dimension(s) {unknown}; known: {sorted(SCENARIO_KEYS)}")
        missing = sorted(SCENARIO_KEYS - OPTIONAL_KEYS - set(d))
        if missing:
            raise ScenarioError(f"missing scenario key(s) {missing}")
        for key, plain in (("loop", PLAIN_LOOP), ("module", PLAIN_MODULE)):
            if isinstance(d.get(key), dict):  # a file from before a loop or module dimension: its plain value
                d = dict(d, **{key: dict({k: v for k, v in plain.items() if k not in d[key]}, **d[key])})
        s = cls(**d)
        s.validate()
        return s

    def validate(self) -> None:
        """Raises ScenarioError naming the first bad value."""
        if self.optimizer not in ALL_OPTIMIZERS:
            raise ScenarioError(f"optimizer {self.optimizer!r}: one of {ALL_OPTIMIZERS}")
        if not isinstance(self.ddp, dict) or set(self.ddp) - DDP_KEYS:
            raise ScenarioError(f"unknown DDP keyword(s) {sorted(set(self.ddp) - DDP_KEYS)}; known: {sorted(DDP_KEYS)}")
        for k in BOOL_KEYS:
            if not isinstance(self.ddp.get(k, False), bool):
                raise ScenarioError(f"DDP keyword {k} {self.ddp[k]!r}: true or false")
        for k in OPTIONAL_BOOL_KEYS:
            if self.ddp.get(k) is not None and not isinstance(self.ddp[k], bool):
                raise ScenarioError(f"DDP keyword {k} {self.ddp[k]!r}: true, false or null")
        caps = self.ddp.get("bucket_cap_mb_list")
        if caps is not None and not (isinstance(caps, list) and caps and all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0 for c in caps)):
            raise ScenarioError(f"bucket_cap_mb_list {caps!r}: a non-empty list of positive MiB")
        if self.ddp.get("comm_hook") not in (None, "allreduce"):
            raise ScenarioError(f"comm_hook {self.ddp['comm_hook']!r}: only 'allreduce'")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ScenarioError(f"lr {self.lr!r}: a positive number")
        if not self.steps or not isinstance(self.steps, list):
            raise ScenarioError("steps: a non-empty list")
        w = None
        for i, step in enumerate(self.steps):
            if (not isinstance(step, dict) or not STEP_KEYS <= set(step) <= STEP_KEYS | STEP_OPTIONAL
                    or not step["micro"]):
                raise ScenarioError(f"step {i + 1}: an object with a non-empty 'micro' list "
                                    f"(and optionally {sorted(STEP_OPTIONAL)})")
            for j, m in enumerate(step["micro"]):
                if not isinstance(m, dict) or not MICRO_KEYS <= set(m) <= MICRO_KEYS | MICRO_OPTIONAL:
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: keys {sorted(MICRO_KEYS)} "
                                        f"(and optionally {sorted(MICRO_OPTIONAL)})")
                if "sync" in m and (not isinstance(m["sync"], bool)
                                    or (j == len(step["micro"]) - 1 and not m["sync"])):
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: sync is true or false, and "
                                        "true at the window's last micro-step (the step needs synced gradients)")
                if "forwards" in m and not (isinstance(m["forwards"], int) and not isinstance(m["forwards"], bool)
                                            and 1 <= m["forwards"] <= MAX_FORWARDS):
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: forwards {m['forwards']!r}: "
                                        f"an integer 1..{MAX_FORWARDS}")
                w = w or len(m["batch"])
                if len(m["batch"]) != w or len(m["plan"]) != w or w < 1:
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: batch and plan need one entry per replica")
                if any(not isinstance(n, int) or n < 1 for n in m["batch"]):
                    raise ScenarioError(f"step {i + 1} micro-step {j + 1}: local batch sizes are integers >= 1")
                for p in m["plan"]:
                    if any(b not in BRANCHES for b in p) or len(set(p)) != len(p):
                        raise ScenarioError(f"step {i + 1} micro-step {j + 1}: plan {p}: "
                                            f"distinct branches of {BRANCHES}")
        if self.checkpoint_at is not None and not 0 <= self.checkpoint_at < len(self.steps) - 1:
            raise ScenarioError(f"checkpoint_at {self.checkpoint_at}: a step before the last")
        self._validate_topology()
        self._validate_workload()
        self._validate_loop(w)

    def _validate_topology(self) -> None:
        """A topology's graph, and the plain workload and module beside it (its corners are its nodes')."""
        if self.topology is None:
            return
        try:
            validate_topology(self.topology)
        except TopologyError as exc:
            raise ScenarioError(str(exc)) from None
        if self.workload != PLAIN_WORKLOAD or self.module != PLAIN_MODULE:
            raise ScenarioError("a topology scenario has the plain workload and module (its corners are its "
                                "nodes')")

    def _validate_loop(self, w: int) -> None:
        """The loop's values and every step's forwards without backward."""
        md = self.module
        _values("module", md, MODULES, MODULES)
        if md["parametrize"] != "none" and (self.workload["graph"] == "shared"
                                            or self.workload["layout"] == "transposed"):
            raise ScenarioError(f"module parametrize {md['parametrize']!r} with workload "
                                f"{workload_corners(self.workload)}: a parametrized weight that is shared "
                                "or a transposed view is not drawn (the parametrization would rebuild it)")
        _values("loop", self.loop, PLAIN_LOOP, LOOPS)
        refused = statement_problems(self)
        if refused:
            raise ScenarioError(refused[0])
        drop = self.loop["lr_drop_at"]
        if drop is not None and not (isinstance(drop, int) and 0 < drop < len(self.steps)):
            raise ScenarioError(f"loop lr_drop_at {drop!r}: null or a step after the first (0-based)")
        for i, step in enumerate(self.steps):
            evals = step.get("eval", [])
            if not isinstance(evals, list):
                raise ScenarioError(f"step {i + 1}: eval is a list")
            for e, f in enumerate(evals):
                where = f"step {i + 1} eval forward {e + 1}"
                if not isinstance(f, dict) or set(f) != EVAL_KEYS:
                    raise ScenarioError(f"{where}: keys {sorted(EVAL_KEYS)}")
                if not (isinstance(f["at"], int) and 0 <= f["at"] <= len(step["micro"])):
                    raise ScenarioError(f"{where}: at {f['at']!r}: a micro-step index 0..{len(step['micro'])}")
                if f["grad"] not in EVAL_GRAD or f["mode"] not in EVAL_MODE:
                    raise ScenarioError(f"{where}: grad one of {EVAL_GRAD}, mode one of {EVAL_MODE}")
                if len(f["batch"]) != w or any(not isinstance(n, int) or n < 1 for n in f["batch"]):
                    raise ScenarioError(f"{where}: batch: one local batch size >= 1 per replica")
                if f["grad"] == "inference_mode" and f["mode"] == "train" and self.rebind_buffers:
                    raise ScenarioError(f"{where}: an inference_mode forward in train mode with buffers "
                                        "rebound in forward makes the buffers inference tensors, which "
                                        "DDP's in-place buffer broadcast may not update (torch raises)")

    def _validate_workload(self) -> None:
        """The workload's values, and the combinations upstream DDP forbids or that mean nothing."""
        wl = self.workload
        _values("workload", wl, WORKLOADS, WORKLOADS, order=wl)
        topo = needs(self.topology) if self.topology is not None else {"sparse": False, "reentrant": False,
                                                                         "reentrant_head": False}
        if (wl["grad"] != "dense" or topo["sparse"]) and self.optimizer not in SPARSE_OPTIMIZERS:
            raise ScenarioError(f"a sparse gradient with optimizer {self.optimizer!r}: sparse "
                                f"gradients need one of {SPARSE_OPTIMIZERS} (torch's Adam/AdamW refuse them)")
        static = bool(self.ddp.get("static_graph"))
        if (wl["graph"] == "checkpoint_reentrant" or topo["reentrant"]) and not static:
            raise ScenarioError("a reentrant activation checkpoint needs DDP static_graph=True (upstream "
                                "raises 'Expected to mark a variable ready only once' without it)")
        if topo["reentrant_head"] and self.ddp.get("find_unused_parameters") and not static:
            raise ScenarioError("reentrant-checkpointed heads with find_unused_parameters=True need DDP "
                                "static_graph=True (upstream raises 'Expected to mark a variable ready only "
                                "once' without it)")
        if static:  # one graph for the whole run: the same plan everywhere
            plans = {tuple(p) for st in self.steps for m in st["micro"] for p in m["plan"]}
            if len(plans) != 1:
                raise ScenarioError("static_graph=True: every replica and micro-step runs the same plan")
            if not self.ddp.get("find_unused_parameters") and len(next(iter(plans))) != len(BRANCHES):
                raise ScenarioError("static_graph=True without find_unused_parameters: the plan uses every branch")
        if self.ddp.get("skip_all_reduce_unused_params"):
            plans = {tuple(sorted(p)) for st in self.steps for m in st["micro"] for p in m["plan"]}
            if len(plans) != 1:  # torch: else replicas desynchronise or hang
                raise ScenarioError("skip_all_reduce_unused_params=True: every replica and micro-step leaves "
                                    "the same branches unused")

    def describe_step(self, s: int, config: bool = True) -> str:
        """The scenario dimensions in play at step ``s`` (0-based), for verdict reasons;
        ``config``: with the optimizer and DDP keywords (the same at every step)."""
        step = self.steps[s]["micro"]
        parts = []
        k = len(step)
        if k > 1:
            parts.append(f"accumulation window of {k} micro-steps (no_sync)")
        batches = [m["batch"] for m in step]
        if any(len(set(b)) > 1 for b in batches):
            parts.append(f"uneven local batches {batches if k > 1 else batches[0]}")
        plans = [m["plan"] for m in step]
        if any(len({tuple(p) for p in pl}) > 1 for pl in plans):
            parts.append("rank-dependent branches/hook order")
        used_last = set().union(*[set(p) for p in plans[-1]])
        used_any = set().union(*[set(p) for pl in plans for p in pl])
        if used_any - used_last:
            parts.append(f"branch(es) {sorted(used_any - used_last)} used only in no_sync micro-steps")
        per_replica = [set().union(*[set(pl[r]) for pl in plans]) for r in range(len(plans[0]))]
        partly = sorted(set().union(*per_replica) - set.intersection(*per_replica))
        if partly:
            parts.append(f"branch(es) {partly} used by some replicas only")
        if set(BRANCHES) - used_any:
            parts.append(f"globally unused branch(es) {sorted(set(BRANCHES) - used_any)}")
        if self.rebind_buffers:
            parts.append("buffers rebound in forward")
        if self.loss_scale_log2:
            parts.append(f"loss scale 2**{self.loss_scale_log2}")
        if self.checkpoint_at is not None and s > self.checkpoint_at:
            parts.append(f"after the checkpoint reload at step {self.checkpoint_at + 1}")
        parts += self.describe_loop(s)
        on = [k for k, v in self.ddp.items() if v not in (None, False)]
        if config:
            parts.append(f"optimizer {self.optimizer}" + (f", DDP {', '.join(on)}" if on else ""))
        workload = self.describe_workload()
        return "; ".join(parts + [workload] if workload else parts)

    def describe_loop(self, s: int) -> list[str]:
        """The loop program's dimensions in play at step ``s`` (0-based), as verdict phrases."""
        micro = self.steps[s]["micro"]
        parts = []
        synced = [j for j in range(len(micro)) if self.synced(s, j)]
        if len(synced) > 1:
            parts.append(f"{len(synced)} synced backwards in one step (their averaged gradients sum)")
        for j in range(len(micro)):
            if self.forwards(s, j) > 1:
                parts.append(f"{self.forwards(s, j)} forwards before one backward at micro-step {j + 1} "
                             f"({'synced' if self.synced(s, j) else 'no_sync'})")
        for e, f in enumerate(self.steps[s].get("eval", ())):
            where = ("after the last backward, before the step" if f["at"] == len(micro)
                     else f"before micro-step {f['at'] + 1}")
            if f["grad"] == "raising":
                parts.append(f"a forward that raises after the buffers moved (skipped) in {f['mode']} mode {where}")
                continue
            grad = "grad enabled" if f["grad"] == "enabled" else f["grad"]
            parts.append(f"a forward without backward under {grad} in {f['mode']} mode {where}")
        parts += [MODULE_PHRASES[v] for k, v in self.module.items() if v != PLAIN_MODULE[k]]
        lp = self.loop
        parts += [phrase for (k, v), phrase in LOOP_PHRASES.items() if lp[k] == v]
        if lp["lr_drop_at"] is not None and s >= lp["lr_drop_at"]:
            parts.append(f"learning rate x {LR_DROP} from step {lp['lr_drop_at'] + 1}")
        return parts

    def describe_workload(self) -> str:
        """``workload: <corner>, <corner>`` (``""`` for the plain workload), or the topology's description."""
        if self.topology is not None:
            return describe(self.topology)
        corners = workload_corners(self.workload)
        return "workload: " + ", ".join(WORKLOAD_PHRASES[c] for c in corners) if corners else ""


def _values(what: str, got, keys, table: dict, order=None) -> None:
    """Raises ScenarioError unless ``got`` is an object with exactly ``keys`` whose every key of
    ``table`` (in ``order``, default ``table``'s) holds one of that key's values."""
    if not isinstance(got, dict) or set(got) != set(keys):
        raise ScenarioError(f"{what}: an object with keys {sorted(keys)}")
    for k in order or table:
        if got[k] not in table[k]:
            raise ScenarioError(f"{what} {k} {got[k]!r}: one of {table[k]}")


def load_scenario(path: str) -> Scenario:
    """Read a scenario (or a failure file holding one) from a JSON file.

    Raises:
        ScenarioError: unreadable, not JSON, or invalid (one line).
    """
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as exc:
        raise ScenarioError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        return Scenario.from_json(d)
    except TypeError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
