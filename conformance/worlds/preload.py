"""What the hosts' fork server imports once, before it forks any host (why: :mod:`conformance.worlds.hoststart`).

A host then starts with torch, the parts of torch that the kit's tasks and the DDPs under test
import lazily (``torch._dynamo`` and sympy on a first optimizer, DDP's parts on a first DDP) and
the kit's task modules already loaded. Thread pools are kept to one thread before anything is
imported, so the server holds no worker thread when it forks (OpenBLAS starts one per extra core
on import; a host sets its own environment when it starts).
"""
import importlib
import os


def _one_thread_pools() -> None:  # a function: module-level code reads no os.environ (tests/test_structure.py)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


#: Imported in this order; a module this torch does not have is left out.
MODULES = (
    "torch", "torch.distributed", "torch.optim", "torch._dynamo", "torch.nn.parallel",
    "torch.distributed.algorithms.ddp_comm_hooks", "torch.distributed.algorithms.join",
    "torch.utils.checkpoint", "torch.nn.utils.parametrize", "torch.nn.utils.parametrizations",
    "conformance.evaluate", "conformance.worlds.host",
)

def import_modules() -> None:
    """Import :data:`MODULES` (a launched world's process too, before its isolation snapshot: what
    they register or wrap on import is no implementation's change), and install what torch.compile
    installs once per process on its first compile (``torch._dynamo.mutation_guard`` wraps
    ``nn.Module.__init__`` and ``__setstate__``): put back after a compiling row, it would stay
    missing, as torch marks it installed."""
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init
    except ImportError:
        return
    install_generation_tagging_init()


_one_thread_pools()
import_modules()
