"""A software aggregation switch: a pool of integer aggregator slots shared by jobs (SwitchML).

The switch holds ``slots`` rows of ``values`` integers, each in two shadow copies (versions 0
and 1). A job's workers JOIN (a barrier): the first JOIN grants the job up to the slots it asks
for from the free pool, or none when the pool is empty (``NOSLOT``, with every worker's address,
so that they sum among themselves: ATP's fallback to end-host aggregation); the answer goes to
every worker once all have joined. In the data phase a worker keeps each of its slots busy with
one block at a time: phase ``j`` of a slot uses copy ``j mod 2``. The switch adds the payload
into the copy and sets the worker's bit; a second copy of the same packet (a retransmission or
duplicate) is not added again. When all ``n`` bits are set it sends the sum to every worker
(one numpy add per packet, one clip per result). Phase ``j + 2`` reuses the copy only after
every worker has received phase ``j + 1``'s result, and so phase ``j``'s, so a retransmission
of phase ``j`` whose result was lost still finds it in its copy and gets it back. LEAVE is the
closing barrier: when all have left, the slots return to the pool. A job idle for ``lease``
seconds (a worker died) is freed too.

Datagrams that fail validation are counted and ignored; ones that parse but break the protocol
(wrong worker count, slot, phase) are answered with ``REJECT`` and a :class:`Reason`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from commflow.ina.faults import Faults
from commflow.ina.protocol import (
    EMPTY,
    MAX_VALUES,
    MAX_WORKERS,
    WIRE,
    Header,
    InaError,
    InaProtocolError,
    Kind,
    Reason,
    pack,
    pack_peers,
    unpack,
)

Address = tuple[str, int]
_LO, _HI = -(2**31), 2**31 - 1


@dataclass
class SwitchStats:
    """What a switch has seen."""

    datagrams: int = 0
    """Datagrams received."""
    aggregated: int = 0
    """DATA packets added into a slot."""
    results: int = 0
    """Slot phases completed (each sent to every worker)."""
    duplicates: int = 0
    """DATA packets already counted (answered with the result when complete)."""
    stale: int = 0
    """DATA packets of a phase older than the slot's copy (dropped)."""
    malformed: int = 0
    """Datagrams that failed validation (ignored)."""
    rejected: int = 0
    """Datagrams answered with REJECT."""
    saturated: int = 0
    """Results clipped to int32 (a worker broke the no-overflow scaling)."""
    sessions: int = 0
    """Jobs joined."""
    refused: int = 0
    """Jobs told NOSLOT."""
    last_error: str = ""
    """The last validation error, for diagnosis."""


@dataclass
class _Job:
    session: int
    slots: list[int]
    addrs: list[Address | None]
    joined: int = 0
    left: int = 0
    active: float = 0.0


@dataclass
class Switch:
    """Aggregation state and packet handling, without a socket (``handle`` returns what to
    send); :func:`run_switch` puts it on UDP."""

    nworkers: int
    """Workers per job (every job has this many)."""
    slots: int
    """Aggregator slots in the pool."""
    values: int = 256
    """int32 values per packet (one slot row)."""
    lease: float = 30.0
    """Seconds after which an idle job's slots return to the pool."""
    stats: SwitchStats = field(default_factory=SwitchStats)

    def __post_init__(self) -> None:
        if not 1 <= self.nworkers <= MAX_WORKERS:
            raise InaError(f"ina switch: {self.nworkers} workers; use 1 to {MAX_WORKERS}")
        if not 1 <= self.slots <= 65535 or not 1 <= self.values <= MAX_VALUES:
            raise InaError(f"ina switch: slots {self.slots} must be in [1, 65535] and values "
                           f"per packet {self.values} in [1, {MAX_VALUES}]")
        if self.slots * self.values > 1 << 26:
            raise InaError(f"ina switch: {self.slots} slots x {self.values} values would hold "
                           f"{16 * self.slots * self.values >> 20} MiB; keep slots x values "
                           f"<= {1 << 26}")
        self._acc = np.zeros((2, self.slots, self.values), np.int64)
        self._phase = [[-2] * self.slots, [-1] * self.slots]
        self._seen = [[0] * self.slots, [0] * self.slots]
        self._nseen = [[0] * self.slots, [0] * self.slots]
        self._exp = [[EMPTY] * self.slots, [EMPTY] * self.slots]
        self._where = [[(0, 0)] * self.slots, [(0, 0)] * self.slots]
        self._result: list[list[bytes]] = [[b""] * self.slots, [b""] * self.slots]
        self._free = list(range(self.slots - 1, -1, -1))
        self._jobs: dict[int, _Job] = {}
        self._session = 0
        self._full = (1 << self.nworkers) - 1

    @property
    def free_slots(self) -> int:
        """Slots not granted to any job."""
        return len(self._free)

    def handle(self, data: bytes, addr: Address, now: float | None = None
               ) -> list[tuple[bytes, Address]]:
        """Process one datagram from ``addr``; returns the datagrams to send."""
        self.stats.datagrams += 1
        try:
            h, payload = unpack(data)
        except InaProtocolError as e:
            self.stats.malformed += 1
            self.stats.last_error = f"from {addr[0]}:{addr[1]}: {e}"
            return []
        reason = self._check(h)
        if reason is not Reason.NONE:
            return self._reject(h, reason, addr)
        now = time.monotonic() if now is None else now
        if h.kind is Kind.JOIN:
            return self._join(h, addr, now)
        if h.kind is Kind.LEAVE:
            return self._leave(h, addr)
        return self._data(h, payload, addr, now)

    def expire(self, now: float | None = None) -> list[int]:
        """Free the jobs idle for longer than ``lease``; returns their ids."""
        now = time.monotonic() if now is None else now
        old = [j for j, job in self._jobs.items() if now - job.active > self.lease]
        for j in old:
            self._free.extend(self._jobs.pop(j).slots)
        return old

    def _check(self, h: Header) -> Reason:
        if h.kind not in (Kind.DATA, Kind.JOIN, Kind.LEAVE):
            return Reason.BAD_KIND
        if h.nworkers != self.nworkers:
            return Reason.WRONG_NWORKERS
        if h.worker >= self.nworkers:
            return Reason.BAD_WORKER
        return Reason.NONE

    def _reject(self, h: Header, reason: Reason, addr: Address) -> list[tuple[bytes, Address]]:
        self.stats.rejected += 1
        self.stats.last_error = f"from {addr[0]}:{addr[1]}: {reason.name} ({h.kind.name})"
        reply = Header(Kind.REJECT, h.job, h.session, h.worker, h.nworkers, h.slot, 0, h.exp,
                       h.phase, h.offset, h.flags, reason)
        return [(pack(reply), addr)]

    def _join(self, h: Header, addr: Address, now: float) -> list[tuple[bytes, Address]]:
        job = self._jobs.get(h.job)
        if job is None:
            grant = min(max(1, h.slot), len(self._free))
            self._session = self._session % 65535 + 1
            job = _Job(self._session, [self._free.pop() for _ in range(grant)],
                       [None] * self.nworkers)
            for g in job.slots:
                self._phase[0][g], self._phase[1][g] = -2, -1
                self._nseen[0][g] = self._nseen[1][g] = 0
            self._jobs[h.job] = job
            self.stats.sessions += 1
            self.stats.refused += not grant
        job.active = now
        job.addrs[h.worker] = addr
        was = job.joined
        job.joined |= 1 << h.worker
        if job.joined != self._full:
            return []
        to = range(self.nworkers) if was != self._full else [h.worker]
        if not job.slots:
            peers = pack_peers(job.addrs)
            return [(pack(Header(Kind.NOSLOT, h.job, job.session, w, self.nworkers, 0,
                                 self.nworkers), peers), job.addrs[w]) for w in to]
        return [(pack(Header(Kind.JOINED, h.job, job.session, w, self.nworkers,
                             len(job.slots), self.values)), job.addrs[w]) for w in to]

    def _leave(self, h: Header, addr: Address) -> list[tuple[bytes, Address]]:
        job = self._jobs.get(h.job)
        if job is None or job.session != h.session:
            return [(pack(Header(Kind.LEFT, h.job, h.session, h.worker, self.nworkers)), addr)]
        job.addrs[h.worker] = addr
        job.left |= 1 << h.worker
        if job.left != self._full:
            return []
        del self._jobs[h.job]
        self._free.extend(job.slots)
        return [(pack(Header(Kind.LEFT, h.job, h.session, w, self.nworkers)), job.addrs[w])
                for w in range(self.nworkers)]

    def _data(self, h: Header, payload: memoryview, addr: Address, now: float
              ) -> list[tuple[bytes, Address]]:
        job = self._jobs.get(h.job)
        if job is None or job.session != h.session:
            return self._reject(h, Reason.UNKNOWN_JOB, addr)
        if h.slot >= len(job.slots):
            return self._reject(h, Reason.BAD_SLOT, addr)
        if h.count > self.values:
            return self._reject(h, Reason.TOO_MANY_VALUES, addr)
        v, g, bit = h.phase & 1, job.slots[h.slot], 1 << h.worker
        if h.ver != v:
            return self._reject(h, Reason.BAD_PHASE, addr)
        job.active = now
        job.addrs[h.worker] = addr
        current = self._phase[v][g]
        row = self._acc[v, g]
        if h.phase == current:
            if self._seen[v][g] & bit:
                self.stats.duplicates += 1
                if self._nseen[v][g] == self.nworkers:
                    return [(self._reply(h, v, g, h.worker), addr)]
                return []
            if self._where[v][g] != (h.offset, h.count):
                return self._reject(h, Reason.BAD_PHASE, addr)
            row[:h.count] += np.frombuffer(payload, WIRE)
            self._seen[v][g] |= bit
            self._nseen[v][g] += 1
            self._exp[v][g] = max(self._exp[v][g], h.exp)
        elif h.phase == current + 2 and (h.phase < 1 or (
                self._phase[1 - v][g] == h.phase - 1
                and self._nseen[1 - v][g] == self.nworkers)):
            row[:h.count] = np.frombuffer(payload, WIRE)
            self._phase[v][g] = h.phase
            self._seen[v][g] = bit
            self._nseen[v][g] = 1
            self._exp[v][g] = h.exp
            self._where[v][g] = (h.offset, h.count)
        elif h.phase < current:
            self.stats.stale += 1
            return []
        else:
            return self._reject(h, Reason.BAD_PHASE, addr)
        self.stats.aggregated += 1
        if self._nseen[v][g] < self.nworkers:
            return []
        self.stats.results += 1
        total = row[:h.count]
        if total.size and (total.min() < _LO or total.max() > _HI):
            self.stats.saturated += 1
            total = np.clip(total, _LO, _HI)
        self._result[v][g] = total.astype(WIRE).tobytes()
        return [(self._reply(h, v, g, w), job.addrs[w]) for w in range(self.nworkers)]

    def _reply(self, h: Header, v: int, g: int, worker: int) -> bytes:
        return pack(Header(Kind.RESULT, h.job, h.session, worker, self.nworkers, h.slot,
                           h.count, self._exp[v][g], h.phase, h.offset, v), self._result[v][g])


def open_socket(host: str, port: int) -> socket.socket:
    """A UDP socket bound to ``host:port`` with 4 MiB buffers (as far as the kernel allows)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InaError(f"ina: cannot bind UDP {host}:{port} ({e.strerror}); choose another "
                       "--port, or 0 for any free one") from None
    return sock


def run_switch(host: str = "127.0.0.1", port: int = 0, nranks: int = 2, slots: int = 64, *,
               values: int = 256, faults: Faults | None = None, lease: float = 30.0,
               stop: threading.Event | None = None,
               ready: Callable[[Address], None] | None = None) -> SwitchStats:
    """Serve a :class:`Switch` on UDP ``host:port`` (loopback by default; port 0: any free
    one) until ``stop`` is set; ``ready`` is called with the bound address first. Every send
    goes through ``faults``. Returns the switch's statistics."""
    switch = Switch(nranks, slots, values=values, lease=lease)
    faults = faults or Faults()
    stop = stop or threading.Event()
    sock = open_socket(host, port)
    sock.settimeout(0.2)
    try:
        if ready is not None:
            ready(sock.getsockname())
        checked = time.monotonic()
        while not stop.is_set():
            try:
                data, addr = sock.recvfrom(65536)
            except TimeoutError:
                data = None
            except ConnectionError:
                continue
            now = time.monotonic()
            if data is not None:
                for out, dst in switch.handle(data, addr, now):
                    try:
                        faults.sendto(sock, out, dst)
                    except OSError:
                        switch.stats.last_error = f"send to {dst[0]}:{dst[1]} failed"
            if now - checked > 1.0:
                switch.expire(now)
                checked = now
    finally:
        sock.close()
    return switch.stats
