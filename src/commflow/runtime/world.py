"""Where this process sits in the job: rank, size and its host's ranks, read from the
environment of commflow's launcher, torchrun or Open MPI's mpirun."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from commflow.errors import CommflowError


@dataclass(frozen=True, kw_only=True)
class WorldSpec:
    """This process's place in the job."""

    rank: int
    """Global rank, 0 .. size-1."""
    size: int
    """Number of ranks in the job."""
    local_rank: int
    """Rank among the processes of this host."""
    local_size: int
    """Number of ranks on this host."""
    job: str
    """Identifier shared by every rank of the job (names shared memory)."""
    source: str
    """Where the spec came from: ``"commflow"``, ``"torchrun"``, ``"mpi"`` or ``"explicit"``."""

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.size and 0 <= self.local_rank < self.local_size
                <= self.size):
            raise CommflowError(
                f"inconsistent world from {self.source}: rank {self.rank} of {self.size}, local "
                f"rank {self.local_rank} of {self.local_size}")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.job):
            raise CommflowError(f"bad job id {self.job!r}: use 1-64 letters, digits, '_', '-'")


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise CommflowError(f"environment variable {key}={env[key]!r} is not an integer") from None


def _token(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)[:64]


def detect_world(env: Mapping[str, str] | None = None) -> WorldSpec:
    """Read the world from ``env`` (default ``os.environ``): commflow's launcher
    (``COMMFLOW_RANK`` ...), torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) or Open MPI
    (``OMPI_COMM_WORLD_*``). Raises ``CommflowError`` when none is present."""
    env = os.environ if env is None else env
    if "COMMFLOW_RANK" in env:
        return WorldSpec(rank=_int(env, "COMMFLOW_RANK"), size=_int(env, "COMMFLOW_WORLD_SIZE"),
                         local_rank=_int(env, "COMMFLOW_LOCAL_RANK"),
                         local_size=_int(env, "COMMFLOW_LOCAL_SIZE"),
                         job=env.get("COMMFLOW_JOB", "default"), source="commflow")
    if "RANK" in env and "WORLD_SIZE" in env:
        size = _int(env, "WORLD_SIZE")
        job = env.get("COMMFLOW_JOB") or _token(
            f"t{env.get('MASTER_ADDR', 'localhost')}-{env.get('MASTER_PORT', '0')}-"
            f"{env.get('TORCHELASTIC_RUN_ID', '')}")
        return WorldSpec(rank=_int(env, "RANK"), size=size,
                         local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env
                         else _int(env, "RANK"),
                         local_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env
                         else size, job=job, source="torchrun")
    if "OMPI_COMM_WORLD_RANK" in env:
        size = _int(env, "OMPI_COMM_WORLD_SIZE")
        job = env.get("COMMFLOW_JOB") or _token(
            "m" + env.get("OMPI_MCA_ess_base_jobid", env.get("PMIX_NAMESPACE", "mpi")))
        return WorldSpec(rank=_int(env, "OMPI_COMM_WORLD_RANK"), size=size,
                         local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
                         local_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"), job=job,
                         source="mpi")
    raise CommflowError(
        "no world found in the environment: start ranks with `commflow run -n N`, torchrun or "
        "mpirun, or call commflow.init(rank=..., world_size=...)")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as taskset or a container's
    cpuset limit it), not all the machine's cores."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without sched_getaffinity
        return os.cpu_count() or 1


def shared_cpus(pids: Iterable[int]) -> int:
    """The CPUs processes ``pids`` may run on together (the union of their affinity masks):
    fewer than the processes means some share a CPU. A mask that cannot be read (the process
    exited) counts as this process's; without ``sched_getaffinity``, :func:`usable_cpus`."""
    if not hasattr(os, "sched_getaffinity"):
        return usable_cpus()
    cpus: set[int] = set()
    for pid in pids:
        try:
            cpus |= os.sched_getaffinity(int(pid))
        except OSError:
            cpus |= os.sched_getaffinity(0)
    return len(cpus)
