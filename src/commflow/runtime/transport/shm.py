"""Shared-memory transport between the ranks of one host: point-to-point messages over the
rings of a :class:`~commflow.runtime.transport.shm_host.ShmHost`, fragment by fragment, with
validated headers; a rank waits by spinning, then yielding, then sleeping on its doorbell.
"""

from __future__ import annotations

import os
import time
from collections import deque

import numpy as np

from commflow.runtime.errors import CommAbortedError, CommMismatchError, CommProtocolError
from commflow.runtime.protocol import (
    HEADER_BYTES,
    Signature,
    check_header,
    check_payload,
    check_signature,
    make_header,
    payload_checksum,
)
from commflow.runtime.transport.shm_host import ShmHost, ShmLayout

__all__ = ["ShmEndpoint", "ShmHost", "ShmLayout", "ShmTransport"]


class ShmTransport:
    """Point-to-point messages between the local ranks of a host over :class:`ShmHost` rings.

    ``ranks`` lists the global rank of each local rank. Fragments that arrive for a channel
    other than the one receiving are set aside (copied) until their channel asks for them.
    With ``checksum`` every fragment carries its payload's CRC-32, verified on receipt
    (``COMMFLOW_CHECKSUM``; see :func:`commflow.runtime.protocol.check_payload`).
    """

    SPIN_ROUNDS = 200
    YIELD_AFTER = 50

    slots = 1
    """Operations of one communicator in flight at once: one (staging areas are shared)."""

    def __init__(self, host: ShmHost, ranks: list[int], *, checksum: bool = False) -> None:
        self.host = host
        self.checksum = checksum
        self.ranks = ranks
        self.local = {g: i for i, g in enumerate(ranks)}
        self.stash: dict[tuple[int, int], deque] = {}
        self.capacity = host.layout.slot_bytes

    def endpoint(self, seq: int, signature: Signature, dtype: np.dtype, members: list[int],
                 comm: int) -> ShmEndpoint:
        """An endpoint for operation ``seq`` of communicator ``comm`` (whose rank i is global
        rank ``members[i]``) moving items of ``dtype``."""
        return ShmEndpoint(self, seq, signature, dtype, members, comm)

    def where(self, src: int, dst: int) -> str:
        """``"rank 1 <- rank 0"`` for messages."""
        return f"rank {dst} <- rank {src}"

    def take(self, peer: int, comm: int, channel: int
             ) -> tuple[np.void, np.ndarray, bool] | None:
        """The next fragment from local rank ``peer`` for ``(comm, channel)``: ``(header,
        payload, in_ring)``; call :meth:`release` after using an in-ring payload."""
        queue = self.stash.get((peer, comm, channel))
        if queue:
            header, payload = queue.popleft()
            return header, payload, False
        host = self.host
        while True:
            slot = host.incoming(peer)
            if slot is None:
                return None
            header = host.header(slot)
            check_header(header, where=self.where(self.ranks[peer], self.ranks[host.me]),
                         capacity=self.capacity, source=self.ranks[peer])
            payload = slot[HEADER_BYTES:HEADER_BYTES + int(header["nbytes"])]
            if header["channel"] == channel and header["comm"] == comm:
                return header, payload, True
            key = (peer, int(header["comm"]), int(header["channel"]))
            self.stash.setdefault(key, deque()).append(
                (header.copy(), payload.copy()))
            host.consume(peer)

    def release(self, peer: int) -> None:
        """Free the in-ring fragment last returned by :meth:`take` for ``peer``."""
        self.host.consume(peer)


def call_word(comm: int, seq: int) -> int:
    """A posted call's identity in one flag word, never 0: communicator id (31 bits) and the
    sequence number (1 .. 2**32 - 1, wrapping); the compiled path computes the same."""
    return (comm & 0x7FFF_FFFF) << 32 | (seq % 0xFFFF_FFFF + 1)


class ShmEndpoint:
    """The :class:`~commflow.runtime.executor.Endpoint` of one operation over shared memory."""

    def __init__(self, transport: ShmTransport, seq: int, signature: Signature,
                 dtype: np.dtype, members: list[int], comm: int) -> None:
        self.t = transport
        self.members = members
        self.comm = comm
        self.seq = seq
        self.signature = signature
        self.digest = signature.digest
        self.dtype = dtype
        self.busy: list[int] | None = None
        """Unfinished sends and receives per local peer, once one was started: then only
        those peers' deaths abort the operation (``None``: every local peer's does)."""
        self.collective = signature.op == "collective"
        """Collectives share one sequence per communicator; point-to-point operations
        count per peer and direction, so only collectives post and compare current calls."""
        if self.collective:
            self._publish()

    def _publish(self) -> None:
        """Post this operation as the rank's current call (flag word 6: :func:`call_word` of
        communicator and sequence number; word 7: signature digest), whatever path runs it,
        so that a peer that called something else in the same slot (e.g. the fast path
        against a program, which never exchange messages) notices. A seqlock: word 6 is
        cleared first and written last, so a reader that finds it equal, and not 0, before and
        after reading word 7 read this call's digest (the same word again is the same call)."""
        flags = self.t.host.flags[self.t.host.me]
        flags[6] = 0
        flags[7] = self.digest & 0x7FFF_FFFF_FFFF_FFFF
        flags[6] = call_word(self.comm, self.seq)

    def check_peers_calls(self) -> None:
        """Raise ``CommMismatchError`` (and abort the host) when a local peer's current call
        is this operation (communicator and sequence number) with another signature."""
        host = self.t.host
        mine = self.digest & 0x7FFF_FFFF_FFFF_FFFF
        word = call_word(self.comm, self.seq)
        for local in range(host.layout.nlocal):
            if local == host.me:
                continue
            flags = host.flags[local]
            before = int(flags[6])
            digest = int(flags[7])
            after = int(flags[6])
            if before == after == word and digest != mine:
                host.abort(ABORT_MISMATCH, host.me, self.seq)
                raise CommMismatchError(
                    f"{self.signature.collective} #{self.seq} on rank "
                    f"{self.t.ranks[host.me]}: rank {self.t.ranks[local]} called another "
                    f"operation in this slot ({self.signature.describe()} here, with its own "
                    "algorithm path): every rank must call the same collectives in the same "
                    "order with the same size, dtype, op, root and algo")

    def _opened(self, op):
        if self.busy is None:
            self.busy = [0] * self.t.host.layout.nlocal
        self.busy[op.peer] += 1
        return op

    def start_send(self, peer: int, channel: int, parts) -> _ShmSend:
        """Begin sending ``parts`` to global rank ``peer``."""
        return self._opened(_ShmSend(self, self.t.local[self.members[peer]], channel,
                                     [p.view(np.uint8) for p in parts]))

    def start_recv(self, peer: int, channel: int, elements: int, sink) -> _ShmRecv:
        """Begin receiving ``elements`` items from global rank ``peer``."""
        return self._opened(_ShmRecv(self, self.t.local[self.members[peer]], channel,
                                     elements * self.dtype.itemsize, sink))

    def idle(self, rounds: int, deadline: float, spin: int | None = None) -> None:
        """Spin (``spin`` rounds; default :attr:`ShmTransport.YIELD_AFTER`), then yield the
        CPU between rounds, then sleep on the doorbell in short slices."""
        host = self.t.host
        if host.aborted():
            self.raise_abort()
        if rounds < self.t.SPIN_ROUNDS:
            if rounds > (self.t.YIELD_AFTER if spin is None else spin):
                os.sched_yield()
            return
        bell = host.bells[host.me]
        if bell[0]:
            bell[0] = 0
            return
        if rounds % 64 == 0:
            self.check_peers_alive()
            if self.collective:
                self.check_peers_calls()
        host.sleep(lambda: bool(bell[0]), max(0.0, deadline - time.monotonic()))

    def check_peers_alive(self) -> None:
        """Raise ``CommAbortedError`` if a local peer this operation still needs (see
        :attr:`busy`) has exited; peers that finished their part may exit."""
        host = self.t.host
        for local, pid in enumerate(host.attached.tolist()):
            needed = self.busy is None or self.busy[local]
            if local != host.me and needed and not _alive(pid):
                host.abort(ABORT_DEAD, local, self.seq)
                raise CommAbortedError(
                    f"{self.signature.collective} #{self.seq}: rank {self.t.ranks[local]} "
                    f"(pid {pid}) has exited; the communicator cannot continue")

    def raise_abort(self) -> None:
        """Raise the error recorded in the host's abort word."""
        code, local, seq = (int(x) for x in self.t.host.abort_word[:3])
        rank = self.t.ranks[local]
        here = f"{self.signature.collective} #{self.seq}"
        if code == ABORT_DEAD:
            raise CommAbortedError(f"{here}: rank {rank} has exited (noticed during operation "
                                   f"#{seq}); the communicator cannot continue")
        if code == ABORT_MISMATCH:
            raise CommMismatchError(
                f"{here}: rank {rank} saw ranks call different operations in slot #{seq}: "
                f"every rank must call the same collectives in the same order with the same "
                f"size, dtype, op and root")
        raise CommAbortedError(f"{here}: aborted by rank {rank} during operation #{seq}")


ABORT_DEAD, ABORT_MISMATCH, ABORT_ERROR = 1, 2, 3


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class _ShmSend:
    __slots__ = ("e", "peer", "channel", "parts", "total", "offset", "owned")

    def __init__(self, e: ShmEndpoint, peer: int, channel: int, parts: list[np.ndarray]) -> None:
        self.e, self.peer, self.channel, self.parts = e, peer, channel, parts
        self.total = sum(len(p) for p in parts)
        self.offset = 0
        self.owned = False

    def detach(self) -> None:
        """Copy the whole message so its source buffers may change."""
        if not self.owned:
            self.parts = [np.concatenate(self.parts) if self.parts else np.zeros(0, np.uint8)]
            self.owned = True

    def poll(self) -> bool:
        host = self.e.t.host
        cap = self.e.t.capacity
        while True:
            slot = host.free_slot(self.peer)
            if slot is None:
                return False
            n = min(cap, self.total - self.offset)
            pos = HEADER_BYTES
            for view in _byte_spans(self.parts, self.offset, n):
                slot[pos:pos + len(view)] = view
                pos += len(view)
            checksum = payload_checksum(slot[HEADER_BYTES:pos]) if self.e.t.checksum else 0
            make_header(slot[:HEADER_BYTES], seq=self.e.seq, signature=self.e.digest,
                        comm=self.e.comm, channel=self.channel, nbytes=n,
                        offset=self.offset, total=self.total, source=self.e.t.ranks[host.me],
                        checksum=checksum)
            host.publish(self.peer)
            self.offset += n
            if self.offset >= self.total:
                self.e.busy[self.peer] -= 1
                return True


class _ShmRecv:
    __slots__ = ("e", "peer", "channel", "total", "offset", "sink")

    def detach(self) -> None:
        """Receives own no source data."""

    def __init__(self, e: ShmEndpoint, peer: int, channel: int, nbytes: int, sink) -> None:
        self.e, self.peer, self.channel, self.total, self.sink = e, peer, channel, nbytes, sink
        self.offset = 0

    def poll(self) -> bool:
        t = self.e.t
        itemsize = self.e.dtype.itemsize
        while self.offset < self.total or self.total == 0:
            got = t.take(self.peer, self.e.comm, self.channel)
            if got is None:
                return False
            header, payload, in_ring = got
            where = t.where(t.ranks[self.peer], t.ranks[t.host.me])
            try:
                check_signature(header, seq=self.e.seq, signature=self.e.signature, where=where)
                if header["offset"] != self.offset or header["total"] != self.total:
                    raise CommMismatchError(
                        f"{where}: operation #{self.e.seq} {self.e.signature.describe()} expected "
                        f"a {self.total}-byte message at offset {self.offset}, got "
                        f"{int(header['total'])} bytes at {int(header['offset'])}: the ranks run "
                        f"different programs")
                if t.checksum or header["checksum"]:
                    check_payload(header, payload, required=t.checksum, peer=t.ranks[self.peer],
                                  what=f"{self.e.signature.collective} #{self.e.seq} on rank "
                                       f"{t.ranks[t.host.me]}", transport="shared memory")
            except CommMismatchError:
                t.host.abort(ABORT_MISMATCH, t.host.me, self.e.seq)
                raise
            except CommProtocolError:
                t.host.abort(ABORT_ERROR, t.host.me, self.e.seq)
                raise
            if len(payload):
                self.sink(self.offset // itemsize, payload.view(self.e.dtype))
            if in_ring:
                t.release(self.peer)
            self.offset += len(payload)
            if self.total == 0:
                break
        self.e.busy[self.peer] -= 1
        return True


def _byte_spans(parts: list[np.ndarray], offset: int, count: int):
    pos = 0
    for p in parts:
        n = len(p)
        if offset < pos + n and offset + count > pos:
            lo, hi = max(offset, pos), min(offset + count, pos + n)
            yield p[lo - pos:hi - pos]
        pos += n
