"""How the ecosystem starts a world, as the training code sees it: one row per launcher (the
environment each replica process gets from it; docs/worlds.md has the survey), and which CPU
world size the kit starts as which launcher would (:data:`WORLD_LAUNCHERS`).

The kit rendezvouses by itself (``file://``), so the launcher's variables are what a DDP *could*
read instead of its process group: a DDP that takes its world size, rank or local world from the
environment is right under one launcher and wrong under another. The world size picks the
launcher, so the default worlds (W=2, W=3) draw two launchers at no extra cost; the others run at
larger world sizes (``--world-size 4,5,6``), and the run's coverage line names what was not drawn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Launcher:
    """One launcher: ``name``, ``label`` (in words), ``source`` (where its environment is
    specified), ``env(rank, world_size, hosts)`` -> the variables replica ``rank`` gets (``str ->
    str``; the world grouped into ``hosts`` hosts of equal size, host-major)."""
    name: str
    label: str
    source: str
    env: Callable


def _torchrun(r: int, w: int, hosts: int) -> dict:
    per = w // hosts
    return {"RANK": str(r), "WORLD_SIZE": str(w), "LOCAL_RANK": str(r % per), "LOCAL_WORLD_SIZE": str(per),
            "GROUP_RANK": str(r // per), "GROUP_WORLD_SIZE": str(hosts), "ROLE_RANK": str(r),
            "ROLE_WORLD_SIZE": str(w), "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none"}


def _mp_spawn(r: int, w: int, hosts: int) -> dict:
    # the script sets the rendezvous address itself and passes rank and world size as arguments
    return {"MASTER_ADDR": "localhost", "MASTER_PORT": "12355"}


def _pod_spawn(r: int, w: int, hosts: int) -> dict:
    # the pod's variables (WORLD_SIZE counts pods, RANK is the pod's index); the script spawns a
    # process per replica and passes the global rank and world size to init_process_group itself
    return {"WORLD_SIZE": str(hosts), "RANK": str(r // (w // hosts)), "MASTER_ADDR": "localhost",
            "MASTER_PORT": "23456"}


def _slurm(r: int, w: int, hosts: int) -> dict:
    per = w // hosts
    return {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % per), "SLURM_NTASKS": str(w),
            "SLURM_NODEID": str(r // per), "SLURM_NNODES": str(hosts), "SLURM_JOB_NUM_NODES": str(hosts),
            "SLURM_NTASKS_PER_NODE": str(per), "SLURM_JOB_ID": "1", "SLURM_JOB_NAME": "train"}


def _lightning(r: int, w: int, hosts: int) -> dict:
    per = w // hosts
    return {"LOCAL_RANK": str(r % per), "NODE_RANK": str(r // per), "WORLD_SIZE": str(w),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12910"}


def _mpirun(r: int, w: int, hosts: int) -> dict:
    per = w // hosts
    return {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(w),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(r % per), "OMPI_COMM_WORLD_LOCAL_SIZE": str(per),
            "OMPI_COMM_WORLD_NODE_RANK": str(r // per)}


LAUNCHERS = {x.name: x for x in (
    Launcher("torchrun", "torchrun (torch.distributed.run; accelerate launch)",
             "https://docs.pytorch.org/docs/stable/elastic/run.html", _torchrun),
    Launcher("mp_spawn", "torch.multiprocessing.spawn (rank and world size as arguments)",
             "https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html", _mp_spawn),
    Launcher("pod_spawn", "Kubeflow PyTorchJob pods, mp.spawn per pod (WORLD_SIZE counts pods, RANK is the pod's "
             "index; the ImageNet example's --multiprocessing-distributed)",
             "https://github.com/kubeflow/trainer/issues/1790; https://github.com/pytorch/examples/blob/main/"
             "imagenet/main.py", _pod_spawn),
    Launcher("slurm", "srun, one task per replica (SLURM_* only)",
             "https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES", _slurm),
    Launcher("lightning", "Lightning's subprocess launcher (LOCAL_RANK, NODE_RANK, WORLD_SIZE; no RANK)",
             "https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/fabric/strategies/"
             "launchers/subprocess_script.py", _lightning),
    Launcher("mpirun", "Open MPI's mpirun (OMPI_COMM_WORLD_*)",
             "https://docs.open-mpi.org/en/main/tuning-apps/environment-var.html", _mpirun),
)}
#: The launcher each CPU world size is started as (any other: torchrun). The default worlds take
#: torchrun (W=2, 2 hosts x 1) and mp.spawn in a PyTorchJob pod (W=3, 1 host x 3: an environment
#: that disagrees with the group); the rest need larger worlds.
WORLD_LAUNCHERS = {2: "torchrun", 3: "pod_spawn", 4: "slurm", 5: "lightning", 6: "mpirun", 7: "mp_spawn"}


def launcher_of(world_size: int) -> Launcher:
    """The launcher a CPU world of ``world_size`` replicas is started as."""
    return LAUNCHERS[WORLD_LAUNCHERS.get(world_size, "torchrun")]


def replica_envs(world_size: int, hosts: int) -> list[dict]:
    """Each replica's launcher variables in a CPU world of ``world_size`` on ``hosts`` hosts."""
    launch = launcher_of(world_size)
    return [launch.env(r, world_size, hosts) for r in range(world_size)]


def launcher_variables() -> list[str]:
    """Every variable some launcher of :data:`LAUNCHERS` sets."""
    return sorted({k for x in LAUNCHERS.values() for k in x.env(0, 2, 1)})


def coverage_line(world_sizes) -> str:
    """One line: the launchers the CPU worlds of ``world_sizes`` were started as, and those not
    drawn with the world size that draws each."""
    drawn = {launcher_of(w).name: w for w in sorted(world_sizes)}
    left = [(n, w) for w, n in sorted(WORLD_LAUNCHERS.items()) if n not in drawn]
    return ("coverage worlds: launchers " + ", ".join(f"{n} (W={w})" for n, w in drawn.items())
            + (f"; not drawn: {', '.join(f'{n} (--world-size {w})' for n, w in left)}" if left else "")
            + " (docs/worlds.md)")
