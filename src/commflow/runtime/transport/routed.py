"""One job over several hosts: shared memory to the ranks of this host, the engine transport
to the others.

Which ranks share a host: ``COMMFLOW_HOST`` when set (emulated hosts in network namespaces
share ``/dev/shm`` and the hostname, so the launcher's index is what counts), else the
hostname. Every rank contributes a fixed-size digest of its key (:func:`host_key`) and hosts
are numbered in order of their first rank (:func:`host_indices`).
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Mapping, Sequence

import numpy as np

from commflow.runtime.errors import CommError, CommMismatchError
from commflow.runtime.protocol import Signature
from commflow.runtime.transport.engine import EngineEndpoint, EngineTransport
from commflow.runtime.transport.shm import (
    ABORT_ERROR,
    ABORT_MISMATCH,
    ShmEndpoint,
    ShmTransport,
)
from commflow.runtime.transport.wire import Wire


def host_key(env: Mapping[str, str]) -> bytes:
    """32 bytes naming this process's host: a digest of ``COMMFLOW_HOST`` when set in
    ``env``, else of the hostname."""
    name = env.get("COMMFLOW_HOST")
    text = f"emulated:{name}" if name is not None else f"hostname:{socket.gethostname()}"
    return hashlib.sha256(text.encode()).digest()


def host_indices(keys: Sequence[bytes]) -> list[int]:
    """The host index of every rank: hosts numbered in order of their lowest rank."""
    first: dict[bytes, int] = {}
    return [first.setdefault(k, len(first)) for k in keys]


class RoutedTransport:
    """Routes each message by its peer's host: :class:`ShmTransport` for this host's ranks
    (``shm`` is ``None`` when this rank is alone on its host), an :class:`EngineTransport` over
    ``wire`` for the rest, holding each engine message ``delay`` seconds.

    ``hosts[g]`` is the host index of global rank ``g``. Engine completions ring this rank's
    shared-memory doorbell, and an engine failure aborts the host's other ranks too. With
    ``checksum`` engine messages carry their payload's CRC-32 (the shared-memory transport
    has its own setting). When every rank is alone on its host, :attr:`slots` operations may
    run at once (the engine's; see :mod:`.engine`), else one.
    """

    def __init__(
        self, wire: Wire, *, hosts: Sequence[int], shm: ShmTransport | None, delay: float = 0.0,
        checksum: bool = False,
    ) -> None:
        self.hosts = list(hosts)
        self.here = self.hosts[wire.rank]
        self.shm = shm
        if shm is None:
            self.engine = EngineTransport(wire, delay=delay, checksum=checksum)
            if len(set(self.hosts)) < len(self.hosts):
                self.engine.slots = 1  # the same on every rank: other hosts use shared memory
            return
        host = shm.host

        def abort(error: CommError, seq: int) -> None:
            code = ABORT_MISMATCH if isinstance(error, CommMismatchError) else ABORT_ERROR
            host.abort(code, host.me, seq)

        self.engine = EngineTransport(
            wire, delay=delay, wake=lambda: host.ring(host.me), on_failure=abort,
            checksum=checksum,
        )
        self.engine.slots = 1  # shared memory runs one operation at a time

    @property
    def slots(self) -> int:
        """Operations of one communicator that may be in flight at once."""
        return self.engine.slots

    def endpoint(
        self, seq: int, signature: Signature, dtype: np.dtype, members: list[int], comm: int
    ) -> RoutedEndpoint:
        """An endpoint for operation ``seq`` of communicator ``comm`` (whose rank i is global
        rank ``members[i]``) moving items of ``dtype``."""
        return RoutedEndpoint(self, seq, signature, dtype, members, comm)


class RoutedEndpoint:
    """The :class:`~commflow.runtime.executor.Endpoint` of one operation across hosts."""

    def __init__(
        self,
        transport: RoutedTransport,
        seq: int,
        signature: Signature,
        dtype: np.dtype,
        members: list[int],
        comm: int,
    ) -> None:
        self.engine = transport.engine
        remote = transport.engine.endpoint(seq, signature, dtype, members, comm)
        self.remote = remote
        self.local: ShmEndpoint | None = None
        if transport.shm is not None:
            self.local = transport.shm.endpoint(seq, signature, dtype, members, comm)
        self.route: list[ShmEndpoint | EngineEndpoint] = [
            self.local if transport.hosts[g] == transport.here and self.local else remote
            for g in members
        ]

    def start_send(self, peer: int, channel: int, parts):
        """Begin sending ``parts`` to communicator rank ``peer`` by its host's transport."""
        return self.route[peer].start_send(peer, channel, parts)

    def start_recv(self, peer: int, channel: int, elements: int, sink):
        """Begin receiving ``elements`` items from communicator rank ``peer``."""
        return self.route[peer].start_recv(peer, channel, elements, sink)

    def idle(self, rounds: int, deadline: float) -> None:
        """Wait as shared memory does (its doorbell also rings for engine completions), but
        no longer than the engine allows (a held message falling due, or MPI polling); an
        operation with no shared-memory traffic waits as the engine does, so local peers that
        have exited do not concern it."""
        if self.local is None or self.local.busy is None:
            self.remote.idle(rounds, deadline)
            return
        cap = time.monotonic() + self.engine.wait_slice()
        self.local.idle(rounds, min(deadline, cap))
