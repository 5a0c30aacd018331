"""Joining a job: :func:`init` builds this rank's :class:`Communicator`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from commflow.errors import CommflowError
from commflow.runtime.calls import check_timeout
from commflow.runtime.cluster import link_delay
from commflow.runtime.communicator import Communicator
from commflow.runtime.protocol import checksum_from_env
from commflow.runtime.shm import SharedRegion, segment_name
from commflow.runtime.token import shm_token
from commflow.runtime.transport.routed import RoutedTransport, host_indices, host_key
from commflow.runtime.transport.shm import ShmHost, ShmLayout, ShmTransport
from commflow.runtime.transport.wire import open_wire
from commflow.runtime.world import WorldSpec, detect_world

DEFAULT_TIMEOUT = 300.0
"""Seconds any blocking wait may take before ``CommTimeoutError`` unless ``init(timeout=)`` or
the environment variable ``COMMFLOW_TIMEOUT`` says otherwise."""

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


def _shm_transport(
    job: str, local_rank: int, ranks: list[int], suffix: str, timeout: float, checksum: bool,
    token: str,
) -> ShmTransport:
    """Shared memory among ``ranks`` (global ranks of this host, in local order) through the
    segment ``commflow.<job>.<suffix>.<token>`` (``commflow.<job>.<suffix>`` without a token,
    see :mod:`commflow.runtime.token`), which local rank 0 creates."""
    layout = shm_layout(len(ranks))
    name = segment_name(job, f"{suffix}.{token}" if token else suffix)
    if local_rank == 0:
        region = SharedRegion.create(name, layout.total)
    else:
        region = SharedRegion.attach(name, layout.total, timeout)
    host = ShmHost(region, layout, local_rank)
    host.attach(timeout)
    return ShmTransport(host, ranks, checksum=checksum)


def init(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    local_size: int | None = None,
    job: str | None = None,
    timeout: float | None = None,
    store=None,
    checksum: bool | None = None,
) -> Communicator:
    """Join the job and return the world communicator.

    With no arguments the world comes from the environment (``commflow run``, torchrun or
    mpirun); otherwise pass ``rank`` and ``world_size`` (and ``job``, a token shared by the
    ranks). ``timeout`` (s) bounds every blocking wait: by default ``COMMFLOW_TIMEOUT`` from the
    environment, else :data:`DEFAULT_TIMEOUT` (300 s). ``checksum`` makes every message carry
    its payload's CRC-32, checked on receipt (a corrupted one raises ``CommProtocolError``;
    by default ``COMMFLOW_CHECKSUM=1`` in the environment turns it on; every rank must agree).

    When the local size is below the world size or ``COMMFLOW_HOST`` is set, ranks may sit on
    several hosts: they connect through an engine (``COMMFLOW_ENGINE``: ``gloo``, the default,
    meeting at ``MASTER_ADDR:MASTER_PORT``, or through ``store``, a torch.distributed store,
    when given; ``mpi``, the default under mpirun), group by host
    (``COMMFLOW_HOST``, else the hostname), and use shared memory inside a host and the engine
    between hosts; the communicator's ``local_rank``/``local_size`` then count this host's
    ranks. Raises ``CommflowError`` when the world is inconsistent or the ranks do not all
    arrive within ``timeout``.
    """
    timeout = default_timeout(os.environ) if timeout is None else check_timeout(timeout, "init")
    checksum = checksum_from_env(os.environ) if checksum is None else bool(checksum)
    if rank is None and world_size is None:
        spec = detect_world()
    elif rank is None or world_size is None:
        raise CommflowError("init: pass both rank and world_size, or neither")
    else:
        spec = WorldSpec(
            rank=rank,
            size=world_size,
            local_rank=rank if local_rank is None else local_rank,
            local_size=world_size if local_size is None else local_size,
            job=job or "default",
            source="explicit",
        )
    if spec.local_size != spec.size or "COMMFLOW_HOST" in os.environ:
        return _join_hosts(spec, os.environ, timeout=timeout, store=store, checksum=checksum)
    bind_to_cpus(spec.local_rank, spec.local_size, os.environ)
    token = shm_token(rank=spec.rank, job=spec.job, env=os.environ, source=spec.source,
                      timeout=timeout, store=store)
    transport = _shm_transport(spec.job, spec.local_rank, list(range(spec.size)), "host0",
                               timeout, checksum, token)
    return Communicator(spec, transport, timeout=timeout)


def default_timeout(env: Mapping[str, str]) -> float:
    """``COMMFLOW_TIMEOUT`` (seconds) from ``env``, else :data:`DEFAULT_TIMEOUT`; raises
    ``CommflowError`` when it is not a finite number above 0."""
    text = env.get("COMMFLOW_TIMEOUT")
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        raise CommflowError(f"COMMFLOW_TIMEOUT={text!r}: expected seconds, e.g. 60") from None
    return check_timeout(value, "COMMFLOW_TIMEOUT")


def bind_to_cpus(local_rank: int, local_size: int, env: Mapping[str, str]) -> tuple[int, ...]:
    """Pin this rank to its own block of the CPUs the process may use, as Open MPI binds ranks
    to cores by default: rank ``i`` of ``local_size`` gets CPUs ``[i*k, (i+1)*k)`` of the
    allowed set, ``k = ncpus // local_size``, so two ranks never share a core while another
    idles (a waiting rank spins before it yields, and would steal its peer's time). Skipped
    (returns ``()``) when ``COMMFLOW_BIND=none`` or the host has more ranks than CPUs;
    returns the CPUs bound to otherwise."""
    allowed = sorted(os.sched_getaffinity(0))
    if env.get("COMMFLOW_BIND", "").lower() == "none" or local_size > len(allowed):
        return ()
    k = len(allowed) // local_size
    mine = tuple(allowed[local_rank * k:(local_rank + 1) * k])
    os.sched_setaffinity(0, mine)
    return mine


def _join_hosts(
    spec: WorldSpec, env: Mapping[str, str], *, timeout: float, store=None,
    checksum: bool = False,
) -> Communicator:
    """Join a job whose ranks may sit on several hosts (see :func:`init`): after the host
    keys are exchanged, each host's ranks share the segment ``commflow.<job>.host<i>.<token>`` and
    messages between hosts are held :func:`~commflow.runtime.cluster.link_delay` seconds. One
    host's ranks only get the plain shared-memory transport."""
    engine = env.get("COMMFLOW_ENGINE") or ("mpi" if spec.source == "mpi" else "gloo")
    wire = open_wire(
        engine, rank=spec.rank, size=spec.size, job=spec.job, timeout=timeout, env=env,
        store=store,
    )
    hosts = host_indices(wire.allgather(host_key(env)))
    token = shm_token(rank=spec.rank, job=spec.job, env=env, source=spec.source,
                      timeout=timeout, wire=wire)
    here = hosts[spec.rank]
    ranks = [r for r, h in enumerate(hosts) if h == here]
    spec = replace(spec, local_rank=ranks.index(spec.rank), local_size=len(ranks))
    shm = None
    if len(ranks) > 1 or len(ranks) == spec.size:
        shm = _shm_transport(spec.job, spec.local_rank, ranks, f"host{here}", timeout, checksum,
                             token)
    if len(ranks) == spec.size:
        return Communicator(spec, shm, timeout=timeout)
    transport = RoutedTransport(wire, hosts=hosts, shm=shm, delay=link_delay(env),
                                checksum=checksum)
    return Communicator(spec, transport, timeout=timeout)
