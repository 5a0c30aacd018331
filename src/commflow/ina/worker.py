"""The worker side of live in-network aggregation: :func:`ina_allreduce`.

One call is a session: JOIN (a barrier at the switch, which grants slots or answers NOSLOT),
the data stream, LEAVE. The call returns as soon as this worker holds all its results: it sends
LEAVE once and does not wait for the switch's LEFT (the slots return to the pool once every
worker has left). Each call's JOIN carries a random call id; the switch takes a JOIN of the
job with a new id from a worker of the current session as that worker's LEAVE, so a lost LEAVE
is made good by the next call (else by the switch's lease).

The stream is self-clocked: each granted slot carries one packet at a time; the result of
phase ``j`` of slot ``s`` brings the agreed exponent of the slot's next block and releases
phase ``j + 1`` (block ``s + j*k`` of ``k`` slots). SwitchML sends a block's exponent one
block ahead: the JOIN carries those of the first blocks when the worker knows the switch's
values per packet (from an earlier JOINED), and JOINED brings their maxima; else phase 0, with
no values, agrees on them first.

Loss recovery: a packet not answered within the retransmission timeout is sent again. The
timeout adapts as TCP's does (Jacobson/Karels, RFC 6298): ``srtt + 4 rttvar`` from samples of
packets sent once (Karn), within ``[min_rto, max_rto]``, doubled on expiry (at most once per
timeout interval, since the slots time out together). Timers are looked at only once no
result is waiting in the socket, so a worker that was not scheduled for a while does not
resend what was answered. A call that makes no progress for ``timeout`` seconds raises
:class:`InaTimeoutError`.
"""

from __future__ import annotations

import ipaddress
import math
import os
import select
import socket
import time

import numpy as np

from commflow.ina._batch import Batch
from commflow.ina._common import Rto, WorkerStats
from commflow.ina._sockets import check_group, open_group, open_socket
from commflow.ina._stream import first_exponents, stream
from commflow.ina.faults import Faults
from commflow.ina.protocol import (
    MAX_VALUES,
    REASONS,
    VERSION,
    WIRE,
    Header,
    InaError,
    InaNoSlotsError,
    InaProtocolError,
    InaTimeoutError,
    InaVersionError,
    Kind,
    group_field,
    pack,
    unpack,
    unpack_peers,
)
from commflow.ina.ring import udp_ring_allreduce

Address = tuple[str, int]
_values: dict[Address, int] = {}
"""Per switch: its values per packet, from the last JOINED (what JOIN's exponents assume)."""


class _Link:
    """The worker's socket to the switch (and the group's, when it takes multicast results),
    with faults on sends and validated receives into one preallocated buffer."""

    def __init__(self, switch: Address, faults: Faults, stats: WorkerStats, who: str,
                 group: Address | None) -> None:
        try:
            self.switch = (socket.gethostbyname(switch[0]), int(switch[1]))
        except (OSError, ValueError, IndexError, TypeError) as e:
            raise InaError(f"{who}: bad switch address {switch!r} ({e}); pass (host, port)"
                           ) from None
        loopback = ipaddress.ip_address(self.switch[0]).is_loopback
        self.sock = open_socket("127.0.0.1" if loopback else "0.0.0.0", 0, 16 << 20)
        self.socks = [self.sock]
        if group is not None:
            try:
                self.socks.insert(0, open_group(group, self.switch, 16 << 20))
            except InaError:
                self.sock.close()
                raise
        self.poller = select.poll()
        for sock in self.socks:
            self.poller.register(sock, select.POLLIN)
        self.buf = np.zeros(65536, np.uint8)
        self.view = memoryview(self.buf)
        self.faults, self.stats, self.who = faults, stats, who

    def close(self) -> None:
        for sock in self.socks:
            sock.close()

    def send(self, data: bytes | memoryview) -> None:
        """Send to the switch; a failed send counts as a lost packet (the timer resends)."""
        self.stats.sent += 1
        try:
            self.faults.sendto(self.sock, data, self.switch)
        except OSError:
            self.stats.send_errors += 1

    def _receive(self) -> tuple[int, Address] | None:
        for sock in self.socks:
            try:
                return sock.recvfrom_into(self.view, 0, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError, ConnectionError):
                continue
        return None

    def receive_batch(self, batch: Batch) -> int:
        """Read the datagrams waiting on the sockets into ``batch`` without blocking; one not
        from the switch gets length 0. Returns how many."""
        count = 0
        for sock in self.socks:
            first, count = count, batch.receive(sock, count)
            for i in range(first, count):
                if batch.addrs[i] != self.switch:
                    batch.lens[i] = 0
        return count

    def wait(self, seconds: float) -> None:
        """Until a datagram is waiting or ``seconds`` (at least 1 ms) have passed."""
        self.poller.poll(max(1, math.ceil(seconds * 1e3)))

    def recv(self, wait: float | None) -> tuple[Header, memoryview] | None:
        """The next valid datagram from the switch (on either socket) within ``wait`` s
        (``None``: only one already waiting), else ``None``; its payload is a view of
        :attr:`buf`, valid until the next call."""
        got = self._receive()
        if got is None and wait is not None and self.poller.poll(
                max(1, math.ceil(wait * 1e3))):
            got = self._receive()
        if got is None:
            return None
        size, addr = got
        if addr != self.switch:
            self.stats.malformed += 1
            return None
        try:
            return unpack(self.view[:size])
        except InaVersionError as e:
            raise InaVersionError(e.version, (
                f"{self.who}: the switch at {self.switch[0]}:{self.switch[1]} speaks protocol "
                f"version {e.version}, this worker {VERSION}: run the same commflow release "
                "on the switch and on every worker")) from None
        except InaProtocolError:
            self.stats.malformed += 1
            return None

    def refused(self, h: Header, what: str) -> InaProtocolError:
        return InaProtocolError(f"{self.who}: the switch at {self.switch[0]}:{self.switch[1]} "
                                f"refused {what}: {REASONS[h.reason]}")


def _join(link: _Link, request: Header, deadline: float, exps: bytes
          ) -> tuple[Header, bytes]:
    """Send the JOIN ``request`` (with its first block exponents ``exps``) until the switch
    answers JOINED or NOSLOT (same job/worker)."""
    interval, resend = 0.02, 0.0
    while True:
        now = time.monotonic()
        if now >= deadline:
            raise InaTimeoutError(f"{link.who}: no JOINED from the switch at {link.switch[0]}:"
                                  f"{link.switch[1]}; is it running with -n "
                                  f"{request.nworkers}, and have all ranks called it?")
        if now >= resend:
            link.send(pack(request, exps))
            resend, interval = now + interval, min(0.5, 2 * interval)
        got = link.recv(min(resend, deadline) - now)
        if got is None:
            continue
        h = got[0]
        if h.kind is Kind.RESULT and h.job == request.job:
            link.stats.duplicates += 1  # a late result, multicast while others finish
        elif h.job != request.job or h.worker != request.worker:
            link.stats.malformed += 1
        elif h.kind is Kind.REJECT and h.session == request.session:
            raise link.refused(h, request.kind.name)
        elif h.kind in (Kind.JOINED, Kind.NOSLOT):
            return h, bytes(got[1])


def ina_allreduce(array: np.ndarray, *, switch: Address, rank: int, nranks: int, job: int = 0,
                  slots: int = 64, timeout: float = 30.0, fallback: bool = True, comm=None,
                  faults: Faults | None = None, stats: WorkerStats | None = None,
                  min_rto: float = 0.02, max_rto: float = 1.0,
                  group: Address | None = None, out: np.ndarray | None = None
                  ) -> np.ndarray:
    """The sum over ``nranks`` workers of ``array`` (float32 or float64, any shape), computed
    by the switch at ``switch = (host, port)``; every rank calls it with the same shape.
    Written into ``out`` when given (a writable C-contiguous array of ``array``'s shape and
    dtype; ``out=array`` sums in place, as each block is read before its sum arrives) and
    returned; its content is undefined when the call raises.

    ``slots`` is how many aggregator slots (packets in flight) to ask for. When the switch has
    none free for ``job`` (another job holds them) the workers sum on the end hosts (ATP): by
    the runtime's ring allreduce on ``comm`` (a :class:`~commflow.runtime.Communicator` of the
    same ranks) when given, else by :func:`~commflow.ina.ring.udp_ring_allreduce` among the
    addresses the switch lists; with ``fallback=False`` :class:`InaNoSlotsError` is raised.
    ``faults`` (default: from ``COMMFLOW_INA_*``) injects loss on this worker's sends;
    ``stats`` is filled if given. The error per element is at most
    :func:`~commflow.ina.protocol.error_bound`.

    ``group = (multicast address, port)``: this worker also takes results on that group, and
    when every worker of the job names the same one the switch sends each result once, to the
    group, instead of once per worker (the network copies it; a result lost on the way is
    sent again to each worker that asks, as without it). The workers' hosts must be reached
    by the switch's multicast (one network segment); several workers on one host may share
    the group.
    """
    x = np.asarray(array)
    if x.dtype not in (np.float32, np.float64):
        raise InaError(f"ina_allreduce rank {rank}: float32 or float64 array expected, got "
                       f"{x.dtype}")
    if not 0 <= rank < nranks:
        raise InaError(f"ina_allreduce: rank {rank} is not in [0, {nranks})")
    if not 1 <= slots <= 65535 or not 0 <= job <= 65535 or timeout <= 0:
        raise InaError(f"ina_allreduce rank {rank}: slots {slots} must be in [1, 65535], job "
                       f"{job} in [0, 65535] and timeout {timeout} positive")
    flat = np.ascontiguousarray(x).reshape(-1)
    if out is not None and not (isinstance(out, np.ndarray) and out.shape == x.shape
                                and out.dtype == x.dtype and out.flags.c_contiguous
                                and out.flags.writeable):
        raise InaError(f"ina_allreduce rank {rank}: out must be a writable C-contiguous "
                       f"{x.dtype} array of shape {x.shape}, like the input")
    target = np.empty_like(flat) if out is None else out.reshape(-1)
    stats = WorkerStats() if stats is None else stats
    faults = Faults.from_env(salt=rank) if faults is None else faults
    who = f"ina_allreduce job {job} rank {rank}/{nranks}"
    group = None if group is None else check_group(group, who)
    link = _Link(switch, faults, stats, who, group)
    rto = Rto(0.05, min_rto, max_rto)
    try:
        values = _values.get(link.switch, 0)
        count = min(slots, -(-flat.size // values), MAX_VALUES) if values else 0
        exps = first_exponents(flat, values, count) if count else np.zeros(0, np.int64)
        joined, payload = _join(
            link, Header(Kind.JOIN, job, 0, rank, nranks, slots, count, values,
                         int.from_bytes(os.urandom(4), "big"), group_field(group)),
            time.monotonic() + timeout, exps.astype(WIRE).tobytes())
        stats.slots = joined.slot if joined.kind is Kind.JOINED else 0
        nonfinite = None
        if joined.kind is Kind.JOINED:
            _values[link.switch] = joined.count
            first = np.frombuffer(payload, WIRE).astype(np.int64) if payload else None
            nonfinite = stream(link, flat, target, joined, nranks, timeout, rto, first)
        elif fallback and comm is not None:
            stats.fell_back = True
            target[:] = comm.allreduce(flat.astype(np.float64), algo="ring")
        elif fallback:
            stats.fell_back = True
            peers = unpack_peers(payload, joined.count)
            target[:] = udp_ring_allreduce(flat.astype(np.float64), link.sock, peers,
                                           rank=rank, call=joined.session, timeout=timeout,
                                           faults=faults, stats=stats)
        link.send(pack(Header(Kind.LEAVE, job, joined.session, rank, nranks)))
    finally:
        link.close()
        stats.rto = rto.value
    if nonfinite is not None:
        lo = nonfinite * joined.count
        raise InaError(f"{who}: a rank's array holds inf or nan in block {nonfinite} (elements "
                       f"[{lo}, {min(lo + joined.count, flat.size)})), which cannot be "
                       "quantized; the switch's sum of it is void")
    if joined.kind is Kind.NOSLOT and not fallback:
        raise InaNoSlotsError(f"{who}: the switch has no free aggregator slot (other jobs "
                              "hold them all); allow fallback=True to sum on the end hosts, "
                              "or start the switch with more --slots")
    return target.reshape(x.shape) if out is None else out
