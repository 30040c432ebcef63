"""What the hosts' fork server imports once, before it forks any host.

:class:`conformance.worlds.spawned.World` starts its hosts from a ``multiprocessing`` fork
server that has imported this module, so a host starts with torch, the parts of torch that the
kit's tasks and the DDPs under test import lazily, and the kit's task modules already loaded.
A spawned host imports them itself (torch as it starts; ``torch._dynamo`` and sympy on its
first optimizer, which ``torch.optim`` imports then; DDP's parts on its first DDP): CPU-seconds
per host (docs/robustness.md "A lost world is replaced in a tenth of a second"). Thread pools
are kept to one thread before anything is imported, so the server holds no worker thread when
it forks (OpenBLAS starts one per extra core on import).
"""
import importlib
import os


def _one_thread_pools() -> None:
    """Before the imports below: each thread pool library starts with one thread (a host sets
    its own environment when it starts; these only shape the server)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


#: Imported in this order; a module this torch does not have is left out.
MODULES = (
    "torch", "torch.distributed", "torch.optim", "torch._dynamo", "torch.nn.parallel",
    "torch.distributed.algorithms.ddp_comm_hooks", "torch.distributed.algorithms.join",
    "torch.utils.checkpoint", "torch.nn.utils.parametrize", "torch.nn.utils.parametrizations",
    "conformance.evaluate", "conformance.worlds.host",
)

_one_thread_pools()
for _name in MODULES:
    try:
        importlib.import_module(_name)
    except ImportError:
        pass
