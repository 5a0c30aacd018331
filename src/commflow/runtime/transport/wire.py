"""The interface between commflow and an engine that moves tagged point-to-point messages
between hosts (:class:`Wire`, implemented by :mod:`.gloo` and :mod:`.mpi`), its tags
(:func:`tag_of`), and :func:`open_wire`, which connects one. The transport that carries
commflow's messages over a wire is :mod:`.engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from commflow.errors import CommflowError

ENGINES = ("gloo", "mpi")
"""Engines :func:`open_wire` can open."""

_SHARED_CODE = 0xFFF


class Request(Protocol):
    """One engine send or receive in flight."""

    def done(self) -> bool:
        """True once complete; raises ``CommAbortedError`` when the engine failed it."""


class Wire(Protocol):
    """Tagged, non-blocking point-to-point messages of raw bytes between the job's ranks."""

    rank: int
    """This process's rank in the job."""
    size: int
    """Number of ranks in the job."""
    polled: bool
    """True when requests progress only while tested (MPI): waiters must poll, not sleep."""
    threaded: bool
    """True when requests may be posted and tested from several threads at once (gloo)."""
    on_complete: Callable[[], None]
    """Called (from the engine's threads) after a request completes, when not ``polled``."""

    def isend(self, data: np.ndarray, peer: int, tag: int) -> Request:
        """Start sending the bytes of ``data`` (uint8, kept alive by the caller) to ``peer``;
        ``CommAbortedError`` when the engine cannot (e.g. the peer is gone)."""

    def irecv(self, data: np.ndarray, peer: int, tag: int) -> Request:
        """Start receiving a message of at most ``len(data)`` bytes from ``peer``;
        ``CommAbortedError`` when the engine cannot."""

    def allgather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` (all of one length), by rank; blocking."""


def tag_of(comm: int, channel: int, slot: int = 0) -> int:
    """The engine tag of ``(comm, slot, channel)``: ``comm`` modulo 2**15 in the high bits,
    the slot (below 16) in the next 4, the channel in the low 12 (channels from 4095 up, e.g.
    the point-to-point channel, share one code). Streams that share a tag stay ordered;
    headers tell them apart."""
    return (comm & 0x7FFF) << 16 | slot << 12 | min(channel, _SHARED_CODE)


def open_wire(
    engine: str, *, rank: int, size: int, job: str, timeout: float, env: Mapping[str, str],
    store=None,
) -> Wire:
    """Connect this rank to the job's other ranks through ``engine`` (``"gloo"``: rendezvous
    at ``MASTER_ADDR:MASTER_PORT`` from ``env``, or through ``store``, a torch.distributed
    store, when given; ``"mpi"``: ``MPI.COMM_WORLD``).

    Blocks until every rank has joined or ``timeout`` seconds passed. Raises
    ``CommflowError`` for an unknown engine, a missing package or a failed rendezvous.
    """
    if engine == "gloo":
        from commflow.runtime.transport.gloo import GlooWire

        return GlooWire.connect(rank=rank, size=size, job=job, timeout=timeout, env=env,
                                store=store)
    if engine == "mpi":
        from commflow.runtime.transport.mpi import MpiWire

        return MpiWire.connect(rank=rank, size=size)
    raise CommflowError(
        f"unknown engine {engine!r} (COMMFLOW_ENGINE): use one of {', '.join(ENGINES)}"
    )
