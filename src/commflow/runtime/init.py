"""Joining a job: :func:`init` builds this rank's :class:`Communicator`."""

from __future__ import annotations

from commflow.errors import CommflowError
from commflow.runtime.communicator import Communicator
from commflow.runtime.shm import SharedRegion, segment_name
from commflow.runtime.transport.shm import ShmHost, ShmLayout, ShmTransport
from commflow.runtime.world import WorldSpec, detect_world

DEFAULT_TIMEOUT = 300.0
"""Seconds any blocking wait may take before ``CommTimeoutError``."""

_SHM_BUDGET = 256 << 20
_NSLOTS = 8
_STAGE = 8 << 20


def shm_layout(nlocal: int) -> ShmLayout:
    """The segment layout for ``nlocal`` ranks: slots of 64 KiB to 1 MiB, so that all rings
    together stay near 256 MiB, and an 8 MiB staging area per rank for the fast paths."""
    pairs = max(1, nlocal * (nlocal - 1))
    slot = 1 << 20
    while slot > 64 << 10 and pairs * _NSLOTS * slot > _SHM_BUDGET:
        slot //= 2
    return ShmLayout(nlocal=nlocal, nslots=_NSLOTS, slot_bytes=slot, stage_bytes=_STAGE)


def init(*, rank: int | None = None, world_size: int | None = None,
         local_rank: int | None = None, local_size: int | None = None, job: str | None = None,
         timeout: float = DEFAULT_TIMEOUT) -> Communicator:
    """Join the job and return the world communicator.

    With no arguments the world comes from the environment (``commflow run``, torchrun or
    mpirun); otherwise pass ``rank`` and ``world_size`` (and ``job``, a token shared by the
    ranks). ``timeout`` (s) bounds every blocking wait. Raises ``CommflowError`` when the world
    is inconsistent or the ranks do not all arrive within ``timeout``.
    """
    if rank is None and world_size is None:
        spec = detect_world()
    elif rank is None or world_size is None:
        raise CommflowError("init: pass both rank and world_size, or neither")
    else:
        spec = WorldSpec(rank=rank, size=world_size,
                         local_rank=rank if local_rank is None else local_rank,
                         local_size=world_size if local_size is None else local_size,
                         job=job or "default", source="explicit")
    if spec.local_size != spec.size:
        raise CommflowError(
            f"rank {spec.rank}: {spec.size} ranks over several hosts ({spec.local_size} here) "
            f"need an inter-host transport, which this build does not have yet")
    layout = shm_layout(spec.local_size)
    name = segment_name(spec.job, "host0")
    if spec.local_rank == 0:
        region = SharedRegion.create(name, layout.total)
    else:
        region = SharedRegion.attach(name, layout.total, timeout)
    host = ShmHost(region, layout, spec.local_rank)
    host.attach(timeout)
    transport = ShmTransport(host, list(range(spec.size)))
    return Communicator(spec, transport, timeout=timeout)
