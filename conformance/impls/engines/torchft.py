"""torchft 0.2.0: its ``DistributedDataParallel`` and optimizer wrapper over a ``Manager``, as its
``train_ddp.py`` example wires them, each kit replica one torchft replica group of one process.
The lighthouse its wheel ships (``torchft._torchft.LighthouseServer``) runs in replica 0's
process and forms the quorum of the W replica groups; each group's manager needs its own
``TCPStore``. Gradients are averaged over the quorum with ``ProcessGroupGloo``; the manager
heals a replica from the quorum's first at step 0 (``init_sync``) from the module's and the
optimizer's state dicts: rank 0's initial state reaches every replica without DDP's broadcast.
``zero_grad()`` of the wrapper starts the step's quorum, its ``step()`` commits it.

Two settings keep a fault-free run equal to DDP's: the quorum is synchronous
(``use_async_quorum=False``: with torchft's default asynchronous quorum a healing replica runs
its first forward on its own initial state and contributes a zeroed gradient to that step), and
the first step's quorum is formed inside the wrapper, every replica healed before any returns
(so replicas agree after construction, as DDP's broadcast makes them); the first ``zero_grad``
then starts no second quorum.

torchft's ``DistributedDataParallel`` registers its own comm hook (the manager's all-reduce) over
a one-rank dummy process group: it takes no other hook and has no ``join()``.
"""
from __future__ import annotations

import weakref
from datetime import timedelta

from conformance.impls.engines import NOT_ON_PJRT, missing
from conformance.impls.row import Strategy, refuse_keywords, torch_sync_bn

VERSION = "0.2.0"
#: DDP keywords torchft's DistributedDataParallel passes on to torch's (it sets
#: ``process_group`` and ``find_unused_parameters`` itself).
ACCEPTED = ("broadcast_buffers", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
#: Bound of every manager operation (quorum, collectives, commit, healing).
TIMEOUT = timedelta(seconds=60)
_FIRST_QUORUM_FORMED = weakref.WeakSet()  # wrapped optimizers whose first step's quorum is formed


def _release_with(model, manager, lighthouse) -> None:
    """Shut ``manager`` (then ``lighthouse``, replica 0's) down once ``model`` is collected, or at
    exit: a case may hold several constructions at once (a teacher beside the student)."""
    def release():
        manager.shutdown(wait=False)
        if lighthouse is not None:
            lighthouse.shutdown()
    weakref.finalize(model, release).atexit = True


def _wrap(module, ctx, kwargs, optimizer):
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from torchft._torchft import LighthouseServer
    from torchft.optim import OptimizerWrapper
    refuse_keywords("torchft DistributedDataParallel", kwargs, ACCEPTED)
    lighthouse, address = None, [None]
    if ctx.rank == 0:
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=ctx.world_size,
                                      join_timeout_ms=int(TIMEOUT.total_seconds() * 1000))
        address = [lighthouse.address()]
    dist.broadcast_object_list(address, src=0)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict():
        return {"model": module.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(sd):
        module.load_state_dict(sd["model"])
        optimizer.load_state_dict(sd["optim"])

    manager = Manager(pg=ProcessGroupGloo(timeout=TIMEOUT), min_replica_size=ctx.world_size,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica_{ctx.rank}", lighthouse_addr=address[0], store_addr="127.0.0.1",
                      store_port=store.port, rank=0, world_size=1, timeout=TIMEOUT, quorum_timeout=TIMEOUT,
                      connect_timeout=TIMEOUT, use_async_quorum=False)
    manager._kit_store = store  # the group's store lives as long as its manager
    model = DistributedDataParallel(manager, module, **kwargs)
    manager.start_quorum()  # the first step's: heals every replica from the first
    dist.barrier()  # every replica healed before the source runs a forward (or shuts down)
    _release_with(model, manager, lighthouse)
    wrapped = OptimizerWrapper(manager, optimizer)
    _FIRST_QUORUM_FORMED.add(wrapped)
    return model, wrapped


def _zero_grad(model, optimizer, ctx):
    """The wrapper's ``zero_grad()`` (starts the step's quorum), but the first step's inner
    ``zero_grad`` only: its quorum was formed at construction."""
    if optimizer in _FIRST_QUORUM_FORMED:
        _FIRST_QUORUM_FORMED.discard(optimizer)
        optimizer.optim.zero_grad(set_to_none=True)
    else:
        optimizer.zero_grad(set_to_none=True)


def row() -> Strategy:
    """The ``torchft`` row."""
    return Strategy(
        "torchft", f"torchft {VERSION}: Manager (lighthouse quorum, ProcessGroupGloo), its DistributedDataParallel "
        "and OptimizerWrapper", _wrap, optimizer_first=True,
        zero_grad=_zero_grad, sync_batchnorm=torch_sync_bn, unsupported=dict(NOT_ON_PJRT),
        unsupported_features={"register_comm_hook": "torchft's DistributedDataParallel registers its own comm hook "
                                                    "(the manager's all-reduce); a second one raises",
                              "join": "torchft's DistributedDataParallel runs over a one-rank dummy process group "
                                      "(collectives go through its comm hook): join()'s all-reduces have no group"},
        unavailable=missing("torchft", VERSION, "torchft"))
