"""Lightning Fabric: ``Fabric(accelerator="cpu", devices=W, strategy=DDPStrategy(
process_group_backend="gloo"))``, ``fabric.setup(model, optimizer)`` and
``fabric.backward(loss)``, as its docs' "convert your PyTorch code" wires them; the processes
are launched outside Fabric (its launcher variables are set). The DDP keywords go to
``DDPStrategy``, which hands them to torch's DDP.
"""
from __future__ import annotations

import weakref

from conformance.impls.engines import NOT_ON_PJRT, missing
from conformance.impls.engines._env import launcher_env
from conformance.impls.row import Strategy, torch_sync_bn

VERSION = "2.6.6"
_FABRICS = weakref.WeakKeyDictionary()  # set-up model -> its Fabric


def _wrap(module, ctx, kwargs, optimizer):
    from lightning_fabric import Fabric
    from lightning_fabric.strategies import DDPStrategy
    with launcher_env(ctx):
        fabric = Fabric(accelerator="cpu", devices=ctx.world_size, num_nodes=1,
                        strategy=DDPStrategy(process_group_backend="gloo", **kwargs))
        fabric.launch()  # launched externally: sets up the world (here: adopts the initialised group)
        if fabric.world_size != ctx.world_size:
            raise RuntimeError(f"Fabric sees a world of {fabric.world_size}, the kit's has {ctx.world_size}")
        model, opt = fabric.setup(module, optimizer)
    _FABRICS[model] = fabric
    return model, opt


def row() -> Strategy:
    """The ``lightning_fabric`` row."""
    return Strategy(
        "lightning_fabric", f"lightning-fabric {VERSION}: Fabric(DDPStrategy(process_group_backend='gloo')), "
        "fabric.setup(model, optimizer), fabric.backward(loss)", _wrap, optimizer_first=True,
        backward=lambda model, loss, optimizer, ctx: _FABRICS[model].backward(loss),
        sync_batchnorm=torch_sync_bn, unsupported=dict(NOT_ON_PJRT),
        not_transparent={"state_dict": "Fabric's module wrapper returns the original module's state_dict keys, "
                                       "without DDP's 'module.' prefix (documented: checkpoints load into the bare "
                                       "module)"},
        unavailable=missing("lightning-fabric", VERSION, "lightning-fabric"))
