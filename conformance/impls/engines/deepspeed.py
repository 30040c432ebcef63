"""DeepSpeed 0.19.8, ZeRO stages 0-3: ``deepspeed.initialize(model=, optimizer=, config=)``,
``engine.backward(loss)`` and ``engine.step()``, as its getting-started guide wires them, on its
CPU accelerator (``DS_ACCELERATOR=cpu``; without oneCCL it falls back to gloo). The config keeps
the comparison with DDP exact: float32, no gradient clipping (``gradient_clipping: 0.0``), one
micro-step per step, the kit's optimizer as DeepSpeed's client optimizer.
"""
from __future__ import annotations

from conformance.impls.engines import NOT_ON_PJRT, missing
from conformance.impls.engines._env import launcher_env
from conformance.impls.row import Strategy, refuse_keywords

VERSION = "0.19.8"
#: DDP keywords the engine takes: it broadcasts rank 0's module states at construction, never
#: buffers before a forward, so ``broadcast_buffers`` is accepted and ignored.
ACCEPTED = ("broadcast_buffers",)


def config(stage: int) -> dict:
    """The DeepSpeed config of ZeRO stage ``stage``."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
            "steps_per_print": 2 ** 31 - 1, "wall_clock_breakdown": False}


def _wrap(stage):
    def wrap(module, ctx, kwargs, optimizer):
        refuse_keywords(f"DeepSpeed ZeRO-{stage}", kwargs, ACCEPTED)
        # DeepSpeed picks its accelerator on first use and caches the choice for the process
        with launcher_env(ctx, DS_ACCELERATOR="cpu"):
            import deepspeed
            from deepspeed.utils import groups
            # DeepSpeed caches its process groups per process, from the first initialize: the kit's
            # worlds are re-created between cases, so drop the cache (as its own destroy does).
            groups._release_process_group_references()
            engine, opt, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config(stage))
        return engine, opt
    return wrap


def _gather_grads(module, model, optimizer, ctx):
    """The full gradient of every parameter through ``deepspeed.utils.safe_get_full_grad`` (a
    collective under ZeRO >= 1)."""
    from deepspeed.utils import safe_get_full_grad
    return [safe_get_full_grad(p) for p in module.parameters()]


def _gather_params(module, model, optimizer, ctx):
    """ZeRO-3: every parameter of ``module`` gathered to its full value for reading
    (``deepspeed.zero.GatheredParameters``, no rank modifies it; partitioned again on exit)."""
    import deepspeed
    return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)


#: The layout ZeRO-3 documentedly changes: it partitions every parameter in place.
ZERO3_PARAMETERS = ("ZeRO-3 partitions every parameter in place: outside deepspeed.zero.GatheredParameters "
                    "a parameter holds an empty tensor (its shard in ds_tensor); the kit reads them gathered")


ZERO3_HOOKS = ("ZeRO-3 gathers a submodule's parameters before its forward and releases them after, through "
               "forward and backward hooks it registers on every submodule")


#: DeepSpeed's engine asserts in ``no_sync()`` under gradient partitioning (ZeRO-2, -3).
NO_SYNC = "DeepSpeed's no_sync() asserts: it is incompatible with the gradient partitioning of ZeRO stage {stage}"


def row(stage: int) -> Strategy:
    """The ``deepspeed_zero<stage>`` row (ZeRO-3: parameters read through ``gather_params``)."""
    return Strategy(
        f"deepspeed_zero{stage}", f"DeepSpeed {VERSION} ZeRO-{stage} on its CPU accelerator: deepspeed.initialize, "
        "engine.backward(loss), engine.step()", _wrap(stage), optimizer_first=True,
        backward=lambda model, loss, optimizer, ctx: model.backward(loss),
        optimizer_step=lambda model, optimizer, ctx: model.step(),
        zero_grad=lambda model, optimizer, ctx: model.zero_grad(),
        gather_grads=_gather_grads, gather_params=_gather_params if stage == 3 else None,
        not_transparent={"layout": ZERO3_PARAMETERS, "module_hooks": ZERO3_HOOKS} if stage == 3 else {},
        ignores=frozenset(ACCEPTED), unsupported=dict(NOT_ON_PJRT),
        unsupported_features={"no_sync": NO_SYNC.format(stage=stage)} if stage >= 2 else {},
        unavailable=missing("deepspeed", VERSION, "deepspeed"))


def zero0_row() -> Strategy:
    return row(0)


def zero1_row() -> Strategy:
    return row(1)


def zero2_row() -> Strategy:
    return row(2)


def zero3_row() -> Strategy:
    return row(3)
