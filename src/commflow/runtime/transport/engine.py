"""Point-to-point messages between hosts through an existing engine: torch.distributed's gloo
(:mod:`.gloo`) or MPI through mpi4py (:mod:`.mpi`), each a :class:`~.wire.Wire`.

A message of ``total`` bytes travels as ``max(1, ceil(total / FRAGMENT))`` engine messages,
each a 64-byte header (:mod:`commflow.runtime.protocol`) followed by at most ``FRAGMENT``
payload bytes. Receivers post buffers of the full fragment capacity, so a sender that disagrees
about the size can never overrun one, and validate every header (magic, version, sizes,
sender, operation signature, communicator, channel, offset) before the payload is used. One
engine tag per ``(communicator, slot, channel)`` keeps each ``(src, dst, comm, slot, channel)``
stream in order. Nothing is pickled.

Operations in flight together: over a wire that may be used from several threads
(``Wire.threaded``, gloo's), the transport has :data:`SLOTS` slots and operation ``seq`` uses
slot ``seq % SLOTS``, so a communicator may run up to that many operations at once, one per
thread, each on engine streams of its own (see ``Communicator``: operation ``seq`` runs on
its thread ``seq % SLOTS``, in issue order there). Over MPI (polled, one thread) there is one
slot.

Delay injection: with ``delay > 0`` every message is held that many seconds before it is
handed to the engine, as a link's one-way latency would hold it. The emulated hosts of
``commflow cluster`` need it because this kernel has no ``netem``; ``COMMFLOW_DELAY_US`` sets it
for any run (:func:`commflow.runtime.cluster.link_delay`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime.errors import (
    CommAbortedError,
    CommError,
    CommMismatchError,
    CommProtocolError,
)
from commflow.runtime.protocol import (
    HEADER,
    HEADER_BYTES,
    Signature,
    check_header,
    check_payload,
    check_signature,
    make_header,
    payload_checksum,
)
from commflow.runtime.transport.shm import _byte_spans
from commflow.runtime.transport.wire import Request, Wire, tag_of

FRAGMENT = 1 << 20
"""Payload bytes per engine message at most."""

WINDOW = 8
"""Fragments of one message a receiver keeps posted at a time."""

SLOTS = 4
"""Operations of one communicator in flight at once over a threaded wire (each on engine tags
of its own)."""

T = TypeVar("T")

_POLL_SLICE = 50e-6
_SLEEP_SLICE = 2e-3


def _fragments(total: int) -> list[tuple[int, int]]:
    """``(offset, nbytes)`` of each fragment of a ``total``-byte message."""
    return [(off, min(FRAGMENT, total - off)) for off in range(0, max(total, 1), FRAGMENT)]


class EngineTransport:
    """Messages to ranks of other hosts over a :class:`Wire`, with ``delay`` seconds held
    before each goes out.

    ``wake`` is called (from engine threads) whenever a request completes, e.g. to ring a
    shared-memory doorbell; ``on_failure(error, seq)`` runs before an error is raised, e.g. to
    abort the host's other ranks. With ``checksum`` every fragment carries its payload's
    CRC-32, verified on receipt (``COMMFLOW_CHECKSUM``).
    """

    SPIN_ROUNDS = 200
    YIELD_AFTER = 20

    def __init__(
        self,
        wire: Wire,
        *,
        delay: float = 0.0,
        wake: Callable[[], None] | None = None,
        on_failure: Callable[[CommError, int], None] | None = None,
        checksum: bool = False,
    ) -> None:
        if not (delay >= 0 and math.isfinite(delay)):
            raise CommflowError(f"injected delay must be >= 0 seconds, got {delay!r}")
        self.wire = wire
        self.rank = wire.rank
        self.delay = delay
        self.checksum = checksum
        self.slots = SLOTS if getattr(wire, "threaded", False) and not wire.polled else 1
        self.held: deque[_EngineSend] = deque()
        self.spare: list[np.ndarray] = []
        self.lock = threading.Lock()
        """Guards :attr:`held` and :attr:`spare` (operations run in several threads)."""
        self._waiters: dict[int, threading.Event] = {}
        self.on_failure = on_failure

        def completed() -> None:
            for event in list(self._waiters.values()):
                event.set()
            if wake is not None:
                wake()

        wire.on_complete = completed

    @property
    def woken(self) -> threading.Event:
        """The calling thread's wake-up event: set whenever a request completes."""
        key = threading.get_ident()
        event = self._waiters.get(key)
        if event is None:
            event = self._waiters[key] = threading.Event()
        return event

    def endpoint(
        self, seq: int, signature: Signature, dtype: np.dtype, members: list[int], comm: int
    ) -> EngineEndpoint:
        """An endpoint for operation ``seq`` of communicator ``comm`` (whose rank i is global
        rank ``members[i]``) moving items of ``dtype``."""
        return EngineEndpoint(self, seq, signature, dtype, members, comm)

    def pump(self) -> float:
        """Hand the held messages that are due to the engine, in order; returns the seconds
        until the next one is due (``inf`` when none is held)."""
        if not self.held:
            return math.inf
        with self.lock:
            now = time.monotonic()
            while self.held and self.held[0].release <= now:
                self.held.popleft().post()
            return self.held[0].release - now if self.held else math.inf

    def wait_slice(self) -> float:
        """How long a waiter may sleep before it must look again (s)."""
        return min(self.pump(), _POLL_SLICE if self.wire.polled else _SLEEP_SLICE)

    def buffer(self) -> np.ndarray:
        """A receive buffer of one fragment's capacity (header included)."""
        with self.lock:
            if self.spare:
                return self.spare.pop()
        return np.empty(HEADER_BYTES + FRAGMENT, np.uint8)

    def recycle(self, buf: np.ndarray) -> None:
        """Keep a receive buffer for :meth:`buffer` to hand out again."""
        with self.lock:
            self.spare.append(buf)

    def fail(self, error: CommError, seq: int) -> CommError:
        """Run the failure hook for ``error`` and return it, to be raised."""
        if self.on_failure is not None:
            self.on_failure(error, seq)
        return error


class EngineEndpoint:
    """The :class:`~commflow.runtime.executor.Endpoint` of one operation over the engine."""

    def __init__(
        self,
        transport: EngineTransport,
        seq: int,
        signature: Signature,
        dtype: np.dtype,
        members: list[int],
        comm: int,
    ) -> None:
        self.t = transport
        self.seq = seq
        self.signature = signature
        self.digest = signature.digest
        self.dtype = dtype
        self.members = members
        self.comm = comm
        self.slot = seq % transport.slots

    def start_send(self, peer: int, channel: int, parts: Sequence[np.ndarray]) -> _EngineSend:
        """Begin sending ``parts`` to communicator rank ``peer``."""
        send = _EngineSend(self, self.members[peer], channel, [p.view(np.uint8) for p in parts])
        t = self.t
        if t.delay or t.held:
            with t.lock:
                t.held.append(send)
            t.pump()
        else:
            send.post()
        return send

    def start_recv(self, peer: int, channel: int, elements: int, sink) -> _EngineRecv:
        """Begin receiving ``elements`` items from communicator rank ``peer``."""
        return _EngineRecv(self, self.members[peer], channel, elements * self.dtype.itemsize, sink)

    def idle(self, rounds: int, deadline: float) -> None:
        """Spin, then yield, then sleep until a request completes, a held message is due or
        ``deadline`` (``time.monotonic()`` seconds) comes."""
        t = self.t
        slice_ = t.wait_slice()
        if rounds < t.SPIN_ROUNDS:
            if rounds > t.YIELD_AFTER:
                os.sched_yield()
            return
        woken = t.woken
        woken.wait(max(0.0, min(deadline - time.monotonic(), slice_)))
        woken.clear()

    def where(self, src: int, dst: int) -> str:
        """``"rank 1 <- rank 0 (engine)"`` for messages."""
        return f"rank {dst} <- rank {src} (engine)"

    def guarded(self, peer: int, sending: bool, action: Callable[[], T]) -> T:
        """``action()`` (posting or testing a request with ``peer``), an engine failure
        turned into ``CommAbortedError`` naming the operation and the peer."""
        try:
            return action()
        except CommAbortedError as err:
            verb = "sending to" if sending else "receiving from"
            raise self.t.fail(
                CommAbortedError(
                    f"{self.signature.collective} #{self.seq}: rank {self.t.rank} {verb} rank "
                    f"{peer} failed: {err}; that rank has probably exited"
                ),
                self.seq,
            ) from err


class _EngineSend:
    __slots__ = ("e", "peer", "channel", "parts", "total", "release", "inflight", "owned")

    def __init__(self, e: EngineEndpoint, peer: int, channel: int, parts: list[np.ndarray]) -> None:
        self.e, self.peer, self.channel, self.parts = e, peer, channel, parts
        self.total = sum(len(p) for p in parts)
        self.release = time.monotonic() + e.t.delay
        self.inflight: deque[tuple[Request, np.ndarray]] | None = None
        self.owned = False

    def post(self) -> None:
        """Copy every fragment behind its header and hand it to the engine."""
        e = self.e
        tag = tag_of(e.comm, self.channel, e.slot)
        self.inflight = deque()
        for offset, n in _fragments(self.total):
            buf = np.empty(HEADER_BYTES + n, np.uint8)
            pos = HEADER_BYTES
            for view in _byte_spans(self.parts, offset, n):
                buf[pos : pos + len(view)] = view
                pos += len(view)
            make_header(
                buf[:HEADER_BYTES],
                seq=e.seq,
                signature=e.digest,
                comm=e.comm,
                channel=self.channel,
                nbytes=n,
                offset=offset,
                total=self.total,
                source=e.t.rank,
                checksum=payload_checksum(buf[HEADER_BYTES:]) if e.t.checksum else 0,
            )
            request = e.guarded(self.peer, True, lambda b=buf: e.t.wire.isend(b, self.peer, tag))
            self.inflight.append((request, buf))
        self.parts = []

    def detach(self) -> None:
        """Copy the message if it is still held (posted fragments are copies already); under
        the transport's lock, as another operation's thread may be posting it."""
        with self.e.t.lock:
            if self.inflight is None and not self.owned:
                self.parts = [np.concatenate(self.parts) if self.parts else np.zeros(0, np.uint8)]
                self.owned = True

    def poll(self) -> bool:
        self.e.t.pump()
        if self.inflight is None:
            return False
        while self.inflight and self.e.guarded(self.peer, True, self.inflight[0][0].done):
            self.inflight.popleft()
        return not self.inflight


class _EngineRecv:
    __slots__ = ("e", "peer", "channel", "total", "sink", "pending", "posted", "tag")

    def __init__(self, e: EngineEndpoint, peer: int, channel: int, nbytes: int, sink) -> None:
        self.e, self.peer, self.channel, self.total, self.sink = e, peer, channel, nbytes, sink
        self.tag = tag_of(e.comm, channel, e.slot)
        self.pending = deque(_fragments(nbytes))
        self.posted: deque[tuple[Request, np.ndarray, int, int]] = deque()
        self.refill()

    def refill(self) -> None:
        """Keep up to ``WINDOW`` fragment receives posted."""
        t = self.e.t
        while self.pending and len(self.posted) < WINDOW:
            offset, n = self.pending.popleft()
            buf = t.buffer()
            request = self.e.guarded(
                self.peer, False, lambda b=buf: t.wire.irecv(b, self.peer, self.tag)
            )
            self.posted.append((request, buf, offset, n))

    def detach(self) -> None:
        """Receives own no source data."""

    def poll(self) -> bool:
        e = self.e
        e.t.pump()
        while self.posted and e.guarded(self.peer, False, self.posted[0][0].done):
            _, buf, offset, n = self.posted.popleft()
            self.validate(buf[:HEADER_BYTES].view(HEADER)[0], offset, n,
                          buf[HEADER_BYTES : HEADER_BYTES + n])
            if n:
                self.sink(
                    offset // e.dtype.itemsize, buf[HEADER_BYTES : HEADER_BYTES + n].view(e.dtype)
                )
            e.t.recycle(buf)
            self.refill()
        return not self.posted

    def validate(self, header: np.void, offset: int, n: int, payload: np.ndarray) -> None:
        """Check a received fragment's header against what this receive expects, and its
        ``payload`` against the header's checksum."""
        e = self.e
        where = e.where(self.peer, e.t.rank)
        try:
            check_header(header, where=where, capacity=FRAGMENT, source=self.peer)
            if header["comm"] != e.comm or header["channel"] != self.channel:
                raise CommProtocolError(
                    f"{where}: a message of communicator {int(header['comm'])} channel "
                    f"{int(header['channel'])} arrived on the stream of communicator {e.comm} "
                    f"channel {self.channel}: too many communicators or channels share a tag"
                )
            check_signature(header, seq=e.seq, signature=e.signature, where=where)
            if (header["offset"], header["total"], header["nbytes"]) != (offset, self.total, n):
                raise CommMismatchError(
                    f"{where}: operation #{e.seq} {e.signature.describe()} expected a "
                    f"{self.total}-byte message ({n} bytes at offset {offset}), got "
                    f"{int(header['total'])} bytes ({int(header['nbytes'])} at "
                    f"{int(header['offset'])}): the ranks run different programs"
                )
            if e.t.checksum or header["checksum"]:
                check_payload(header, payload, required=e.t.checksum, peer=self.peer,
                              what=f"{e.signature.collective} #{e.seq} on rank {e.t.rank}",
                              transport="engine")
        except CommError as err:
            raise e.t.fail(err, e.seq) from None
