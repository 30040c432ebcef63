"""What the hosts' fork server imports once, before it forks any host.

:class:`conformance.worlds.spawned.World` starts its hosts from a ``multiprocessing`` fork
server that has imported this module: a host then starts with torch and the kit's task
modules already loaded (a spawned host imports them itself: ~2.7 CPU-seconds each, 9 hosts in
a default run). Thread pools are kept to one thread before anything is imported, so the server
holds no worker threads when it forks (OpenBLAS starts one per extra core on import).
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402,F401
import torch.distributed  # noqa: E402,F401

import conformance.evaluate  # noqa: E402,F401  (every kit task module the hosts run)
import conformance.worlds.host  # noqa: E402,F401
