"""The explicit scenarios every run of a scenario case includes after the generated ones: one
per dimension a fault hides in, so the default budget always covers them; and the builders of
explicit loop programs (a user's model gets the same programs, :mod:`.userloop`)."""
from __future__ import annotations

from conformance.cases.scenario.buckets import cap_mb, grad_bytes
from conformance.cases.scenario.dimensions import (BRANCHES, PLAIN_LOOP, PLAIN_MODULE, PLAIN_WORKLOAD,
                                                   XLA_UNSUPPORTED_LOOP, xla_unsupported)
from conformance.cases.scenario.format import Scenario
from conformance.cases.scenario.generate import LRS, Space
from conformance.cases.scenario.model import build_scenario_model


def uneven_batches(world_size: int) -> list:
    """Uneven local batches (2, 3, 3, 4, ...): DDP averages the replicas' local means equally."""
    return [2 + (r % 2) + (r // 2) for r in range(world_size)]


def explicit_scenarios(world_size: int, space: Space) -> list[Scenario]:
    """Scenarios every run of a case includes (module docstring); a topology case draws its graphs only."""
    if space.topology:
        return []
    if space.workload:
        return explicit_workload_scenarios(world_size, space)
    if "keywords" in space.ddp_extra:
        return explicit_keyword_scenarios(world_size, space)
    if space.loop:
        return explicit_loop_scenarios(world_size, space)
    w = world_size
    all_b = list(BRANCHES)
    extra = {}
    if "buckets" in space.ddp_extra:
        extra = {"bucket_cap_mb": 0.0005, "gradient_as_bucket_view": True}
    if "comm_hook" in space.ddp_extra:
        extra = {"comm_hook": "allreduce"}

    def sc(steps, optimizer="sgd", find_unused=False, **kw):
        base = dict(seed=11, lr=LRS[optimizer][-1] if optimizer == "sgd" else LRS[optimizer][0],
                    optimizer=optimizer, ddp=dict({"find_unused_parameters": find_unused,
                                                   "broadcast_buffers": True}, **extra),
                    rebind_buffers=False, loss_scale_log2=0, checkpoint_at=None, steps=steps)
        base.update(kw)
        return Scenario(**base)

    def step(batches, plans):
        return {"micro": [{"batch": b, "plan": p} for b, p in zip(batches, plans)]}
    rev = [all_b if r % 2 == 0 else all_b[::-1] for r in range(w)]
    uneven = [3 + 2 * (r % 2) + (r // 2) for r in range(w)]
    out = [
        # long run (faults that start late), plain SGD
        sc([step([[2] * w], [[all_b] * w]) for _ in range(60)]),
        # uneven local batches, rank-dependent hook order, buffers rebound in forward
        sc([step([uneven], [rev]) for _ in range(4)], rebind_buffers=True),
        # accumulation window: branch c used only in the no_sync micro-steps
        sc([step([[2] * w, [2] * w], [[all_b] * w, [["a", "b"]] * w]) for _ in range(3)], find_unused=True),
        # locally unused branch (replica 0 skips b), momentum, checkpoint reload, large loss scale
        sc([step([[2] * w], [[["a", "c"]] + [all_b] * (w - 1)]) for _ in range(5)], optimizer="sgd_momentum",
           find_unused=True, checkpoint_at=2, loss_scale_log2=20),
    ]
    if "buckets" in space.ddp_extra:  # buckets exactly full: one holding the model, and several
        sizes = grad_bytes(build_scenario_model(11, False))
        for cls in ("model_exactly", "fills_several"):
            out.append(sc([step([uneven], [rev]) for _ in range(2)],
                          ddp={"find_unused_parameters": False, "broadcast_buffers": True,
                               "bucket_cap_mb": cap_mb(sizes, cls), "gradient_as_bucket_view": cls == "fills_several"}))
    return _finished(out, space)


def _finished(out: list, space: Space) -> list:
    """Explicit scenarios ``out``, validated; with ``space.rank_uniform`` every replica takes
    replica 0's batch size and plan."""
    for e in out:
        if space.rank_uniform:
            for step in e.steps:
                for m in step["micro"]:
                    m["batch"] = [m["batch"][0]] * e.world_size
                    m["plan"] = [list(m["plan"][0]) for _ in range(e.world_size)]
                for f in step.get("eval", ()):  # one graph per forward on every replica
                    f["batch"] = [f["batch"][0]] * e.world_size
        e.validate()
    return out


def explicit_workload_scenarios(world_size: int, space: Space) -> list[Scenario]:
    """The workload case's scenarios every run includes: together they cover every corner of
    :data:`~.dimensions.WORKLOADS` (without :data:`~.dimensions.XLA_UNSUPPORTED` ones with
    ``space.xla_corners``), each on 2 optimizer steps (a static-graph fault shows from the second)."""
    w = world_size
    all_b = list(BRANCHES)
    uneven = uneven_batches(w)

    def sc(workload, optimizer="sgd", static=False, bucket_view=False, find_unused=False, plans=None, **kw):
        plans = plans or [[all_b] * w, [all_b] * w]
        steps = [{"micro": [{"batch": list(uneven), "plan": [list(p) for p in pl]} for pl in plans]} for _ in range(2)]
        base = dict(seed=23, lr=LRS[optimizer][-1] if optimizer == "sgd" else LRS[optimizer][0], optimizer=optimizer,
                    ddp={"find_unused_parameters": find_unused, "broadcast_buffers": True, "bucket_cap_mb": 0.002,
                         "gradient_as_bucket_view": bucket_view, "static_graph": static},
                    rebind_buffers=False, loss_scale_log2=0, checkpoint_at=None, steps=steps,
                    workload=dict(PLAIN_WORKLOAD, **workload))
        base.update(kw)
        return Scenario(**base)
    rev = [all_b if r % 2 == 0 else all_b[::-1] for r in range(w)]
    skip_b = [["a", "c"]] + [all_b] * (w - 1)
    out = [
        # float64 (tight bound), a channels_last conv weight, reentrant checkpoints (static_graph)
        sc({"dtype": "float64", "layout": "channels_last", "graph": "checkpoint_reentrant"}, static=True,
           plans=[[all_b] * w]),  # one micro-step: UPSTREAM_DEFECTS
        # complex64 branch, a transposed head weight, a weight shared by two branches; momentum
        # state (complex), a checkpoint reload
        sc({"dtype": "complex64", "layout": "transposed", "graph": "shared"}, optimizer="sgd_momentum",
           plans=[rev, rev], checkpoint_at=0),
        # sparse Embedding gradients accumulated under no_sync, non-reentrant checkpoints, a branch
        # one replica skips (find_unused_parameters), momentum
        sc({"grad": "sparse", "graph": "checkpoint_nonreentrant"}, optimizer="sgd_momentum",
           find_unused=True, plans=[skip_b, skip_b]),
        # a bfloat16 branch between float32 layers, sparse EmbeddingBag gradients, each branch
        # applied twice, gradient_as_bucket_view, rank-dependent hook order, loss scale 2^20
        sc({"dtype": "bfloat16", "grad": "sparse_bag", "graph": "applied_twice"}, bucket_view=True,
           plans=[rev, rev], loss_scale_log2=20),
    ]
    if space.xla_corners:
        out = [e for e in out if not xla_unsupported(e.workload)]
    return _finished(out, space)


def explicit_keyword_scenarios(world_size: int, space: Space) -> list[Scenario]:
    """The keyword case's scenarios every run includes: together they hold each value class of
    :data:`~.generate.KEYWORD_VALUES`, ``bucket_cap_mb_list`` and ``skip_all_reduce_unused_params``."""
    w = world_size
    all_b = list(BRANCHES)
    rev = [all_b if r % 2 == 0 else all_b[::-1] for r in range(w)]
    uneven = uneven_batches(w)
    sizes = grad_bytes(build_scenario_model(41, False))

    def sc(plans=None, optimizer="sgd", find_unused=False, **ddp):
        steps = [{"micro": [micro_step(uneven, plans or rev)],
                  "eval": [eval_forward(1, "no_grad", "train", uneven)]} for _ in range(2)]
        out = loop_program(steps, seed=41, lr=LRS[optimizer][-1], optimizer=optimizer, find_unused=find_unused,
                           module={"int_buffer": "samples"})
        out.ddp.update(ddp)
        return out
    out = [
        # equal parameters built by the user, each replica's own buffers kept (no forward sync);
        # the batched gradient copy
        sc(init_sync=False, forward_sync_buffers=False, batched_grad_copy=True),
        # the same synced at the first forward; per-bucket caps: the first bucket exactly one
        # gradient, then below the smallest
        sc(init_sync=False, broadcast_buffers=True,
           bucket_cap_mb_list=[cap_mb(sizes, "one_parameter"), cap_mb(sizes, "below_smallest")]),
        # forward_sync_buffers=False still syncs the buffers at construction; caps closing several
        # buckets exactly full
        sc(broadcast_buffers=None, forward_sync_buffers=False, optimizer="sgd_momentum",
           bucket_cap_mb_list=[cap_mb(sizes, "fills_several")] * 2 + [cap_mb(sizes, "model_exactly")]),
        # forward_sync_buffers=True wins over a deprecated broadcast_buffers=False
        sc(broadcast_buffers=False, forward_sync_buffers=True),
        # torch's defaults (None) of both; branch c unused on every replica at every step, its reduction skipped
        sc(plans=[["a", "b"]] * w, find_unused=True, broadcast_buffers=None, skip_all_reduce_unused_params=True),
    ]
    return _finished(out, space)


def loop_program(steps, *, seed: int, lr: float, optimizer: str, find_unused: bool, checkpoint_at=None,
                 module=None, **loop) -> Scenario:
    """One explicit loop program: ``steps`` (each ``{"micro": [...], "eval": [...]}``) under
    ``optimizer`` with ``broadcast_buffers=True``, the plain loop and module settings overridden by
    ``loop`` and ``module``."""
    return Scenario(seed=seed, lr=lr, optimizer=optimizer,
                    ddp={"find_unused_parameters": find_unused, "broadcast_buffers": True},
                    rebind_buffers=False, loss_scale_log2=0, checkpoint_at=checkpoint_at, steps=steps,
                    loop=dict(PLAIN_LOOP, **loop), module=dict(PLAIN_MODULE, **(module or {})))


def micro_step(batch, plans, sync=None, forwards=1) -> dict:
    """A micro-step of a loop program: local batch sizes, per-replica plans, maybe its sync and
    its number of forwards before the backward."""
    m = {"batch": list(batch), "plan": [list(p) for p in plans]}
    if sync is not None:
        m["sync"] = sync
    if forwards != 1:
        m["forwards"] = forwards
    return m


def eval_forward(at: int, grad: str, mode: str, batch) -> dict:
    """A forward without backward before micro-step ``at``, under ``grad`` in module ``mode``."""
    return {"at": at, "grad": grad, "mode": mode, "batch": list(batch)}


def explicit_loop_scenarios(world_size: int, space: Space) -> list[Scenario]:
    """The loop case's scenarios every run includes: together they hold every value of
    :data:`~.dimensions.LOOPS` and of :data:`~.dimensions.MODULES`, each where a fault it reveals
    shows (the comments of :func:`_gradient_programs` and :func:`_forward_programs`)."""
    parts = loop_builders(world_size, 31, True)
    out = _gradient_programs(*parts) + _forward_programs(*parts)
    if space.xla_corners:  # no inference_mode there (XLA_UNSUPPORTED_LOOP): no_grad in its place
        for e in out:
            for st in e.steps:
                for f in st.get("eval", ()):
                    if ("eval", f["grad"]) in XLA_UNSUPPORTED_LOOP:
                        f["grad"] = "no_grad"
    return _finished(out, space)


def loop_builders(world_size: int, seed: int, find_unused: bool, sgd_lr: float | None = None) -> tuple:
    """``(sc, micro, ev)``: the builders of loop programs at ``world_size`` from ``seed`` (a program:
    SGD-family optimizers at ``sgd_lr``, default their largest rate of :data:`~.generate.LRS`, the
    others at their smallest; a micro-step of one plan on every replica; a forward without
    backward), on uneven local batches."""
    w = world_size
    uneven = uneven_batches(w)

    def sc(steps, optimizer="sgd", find_unused=find_unused, module=None, checkpoint_at=None, **loop):
        lr = LRS[optimizer][0]
        if optimizer.startswith("sgd"):
            lr = LRS[optimizer][-1] if sgd_lr is None else sgd_lr
        return loop_program(steps, seed=seed, lr=lr, optimizer=optimizer, find_unused=find_unused,
                            checkpoint_at=checkpoint_at, module=module, **loop)

    def micro(plan=BRANCHES, sync=None, forwards=1):
        return micro_step(uneven, [plan] * w, sync, forwards)

    def ev(at, grad, mode):
        return eval_forward(at, grad, mode, uneven)
    return sc, micro, ev


def _gradient_programs(sc, micro, ev) -> list[Scenario]:
    """The loop programs where zero and ``None`` gradients, synced backwards and clipping meet."""
    return [
        # zero gradients, not None: branch c used at steps 1 and 3 only; at steps 2 and 4 its zero
        # gradient must stay zero (weight decay still moves it; a DDP setting it None skips it); an
        # eval-mode validation forward before each step (DDP broadcasts the buffers there, so the
        # next training forward need not); a learning-rate drop. The module returns a dataclass
        # (find_unused_parameters must walk it) and keeps 'ema' out of its state dict, across a
        # checkpoint reload; an int64 buffer counting the (uneven) local samples, starting
        # rank-dependent (DDP broadcasts integer buffers too); a mask= forward keyword; parameters in
        # an nn.ParameterList and an nn.ParameterDict
        sc([{"micro": [micro(BRANCHES if s % 2 == 0 else ["a", "b"])], "eval": [ev(0, "no_grad", "eval")]}
            for s in range(4)], optimizer="sgd_wd", zero_grad="zeros", lr_drop_at=2, checkpoint_at=1,
           module={"output": "dataclass", "buffers": "non_persistent", "int_buffer": "samples", "kwargs": "mask",
                   "params": "containers"}),
        # None gradients: branch c never used keeps None under AdamW's decoupled weight decay; two synced
        # backwards per step (branch a reached only by the first: its averaged gradient must stay);
        # gradient clipping on the synced gradients
        # (a dict output, a forward pre-hook on the wrapped module, a scale= forward keyword,
        # branch a's weight parametrized symmetric)
        sc([{"micro": [micro(["a", "b"], sync=True), micro(["b"])]} for _ in range(3)], optimizer="adamw",
           clip="norm", module={"output": "dict", "hook": "pre_hook", "kwargs": "scale", "parametrize": "symmetric"}),
    ]


def _forward_programs(sc, micro, ev) -> list[Scenario]:
    """The loop programs where forwards without backward, eval-mode training, several forwards
    per backward and a second DDP (a teacher) meet the buffer broadcast."""
    return [
        # training forwards and backwards in eval mode (gradients still averaged); a no_grad forward in
        # train mode inside an accumulation window (it updates the buffers, and the next forward, not
        # following a synced one, does not broadcast them); an inference_mode forward after the last
        # backward (a namedtuple output with a str and a tensor needing no grad; the head under
        # parametrizations.weight_norm)
        sc([{"micro": [micro(), micro()], "eval": [ev(1, "no_grad", "train"), ev(2, "inference_mode", "eval")]}
            for _ in range(3)], find_unused=False, module_mode="eval",
           module={"output": "namedtuple", "parametrize": "weight_norm"}),
        # clipping where it binds, a train-mode no_grad forward before each step, momentum (the int64
        # sample counter again: updated by the no_grad forward, kept at the training forward after it,
        # which follows a forward without grad; rank 0's comes back before the next step's no_grad forward)
        sc([{"micro": [micro()], "eval": [ev(0, "no_grad", "train")]} for _ in range(4)],
           optimizer="sgd_momentum", find_unused=False, clip="norm", module={"int_buffer": "samples"}),
        # two forwards before one backward (a GAN's discriminator on fake and real batches): DDP
        # broadcasts the buffers between them in the synced micro-step, not under no_sync(); a
        # grad-enabled train-mode forward no backward follows (validation written without
        # no_grad) before each step: the training forward after it broadcasts them again. 'ema' feeds
        # the output, so which buffers a forward starts from moves the parameters too. A frozen teacher
        # DDP (a second instance) runs under no_grad before each training forward: it must leave the
        # trained DDP's broadcast rule alone (a flag shared by instances does not). After the grad-enabled
        # forward, a bad batch the loop skips: the module raises after its buffers moved, DDP's flag stays
        # armed, and the window's first forward broadcasts rank 0's buffers again
        sc([{"micro": [micro(forwards=2), micro(forwards=2)],
             "eval": [ev(0, "enabled", "train"), ev(0, "raising", "train")]}
            for _ in range(3)], module={"buffer_use": "centre"}, teacher="frozen"),
        # fine-tuning with the stem frozen before wrapping (statements.py): the DDP broadcasts it at
        # construction and never reduces it, the optimizer skips its None gradients (momentum and
        # decay would move a zero one); a GAN's generator step: a grad-enabled forward with every
        # parameter frozen, before the window, still arms the next forward's buffer broadcast
        sc([{"micro": [micro(), micro()], "eval": [ev(0, "enabled", "train")]} for _ in range(3)],
           optimizer="sgd_momentum", find_unused=False, module={"buffer_use": "centre"}, freeze="stem",
           toggle="frozen"),
        # pseudo-labelling: a no_grad forward of the trained model between each training forward and its
        # backward (the backward still reduces; the next forward, after one without grad, does not
        # broadcast); rank 0 alone serializes state_dict() after each step and training goes on; before
        # each window a grad-enabled train-mode forward (each replica's buffers move), then an eval-mode
        # no_grad validation forward, which starts from rank 0's broadcast buffers (its outputs judged);
        # fine-tuning that unfreezes: the stem frozen before wrapping and left out of the optimizer, after
        # the first step unfrozen, added to it (add_param_group) and the module wrapped again in a new
        # DDP, which must reduce it (a wrapper reusing the first one's parameter list does not)
        sc([{"micro": [micro(), micro()], "eval": [ev(0, "enabled", "train"), ev(0, "no_grad", "eval")]}
            for _ in range(3)],
           optimizer="sgd_momentum", module={"buffer_use": "centre"}, peek="no_grad", save="rank0", freeze="stem",
           unfreeze="rewrap"),
    ]
