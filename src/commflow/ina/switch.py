"""A software aggregation switch: a pool of integer aggregator slots shared by jobs (SwitchML).

The switch holds ``slots`` rows of ``values`` integers, each in two shadow copies (versions 0
and 1). A job's workers JOIN (a barrier): the first JOIN grants the job up to the slots it asks
for from the free pool, or none when the pool is empty (``NOSLOT``, with every worker's
address, so that they sum among themselves: ATP's fallback to end-host aggregation); the answer
goes to every worker once all have joined, with the maxima of the slots' first block exponents
when every JOIN carried them (phase 0 is then skipped). In the data phase a worker keeps each
of its slots busy with one block at a time: phase ``j`` of a slot uses copy ``j mod 2``. The
switch adds the payload into the copy and sets the worker's bit; a second copy of the same
packet (a retransmission or duplicate) is not added again. When all ``n`` bits are set it sends
the sum to every worker: once, to the job's multicast group, when every worker's JOIN named the
same group (the network copies it to each worker, as SwitchML's switch multicasts), else to
each worker in turn. Phase ``j + 2`` reuses the copy only after every worker has received phase
``j + 1``'s result, and so phase ``j``'s, so a retransmission of phase ``j`` whose result was
lost still finds it in its copy and gets it back. A worker sends LEAVE once it holds all its
results and does not wait for the answer; its next JOIN of the job (a new call id) counts as
that LEAVE when the first was lost. When all have left, the slots return to the pool, and JOINs
of the next session that came in meanwhile are taken up (they were held, not answered, while
another worker still needed the old session's results). A job idle for ``lease`` seconds (a
worker died) is freed too.

``Switch.handle`` does all this in Python, one datagram at a time (the reference);
``Switch.handle_batch``, which :func:`commflow.ina.serve.run_switch` uses, aggregates a batch
of DATA datagrams per compiled call (:mod:`commflow.ina._kernels`) on the same state.

Datagrams that fail validation are counted and ignored; ones that parse but break the protocol
(wrong worker count, slot, phase) are answered with ``REJECT`` and a :class:`Reason`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from commflow.ina import _kernels
from commflow.ina._batch import Batch
from commflow.ina._jobs import Job, grant_table
from commflow.ina.protocol import (
    EMPTY,
    GROUP,
    HEADER,
    MAX_VALUES,
    MAX_WORKERS,
    WIRE,
    Header,
    InaError,
    InaProtocolError,
    InaVersionError,
    Kind,
    Reason,
    group_address,
    pack,
    pack_peers,
    unpack,
    version_notice,
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
    multicast: int = 0
    """Results sent once to a job's multicast group instead of to each worker."""
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
class Switch:
    """Aggregation state and packet handling, without a socket (``handle`` returns what to
    send); :func:`commflow.ina.serve.run_switch` puts it on UDP."""

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
        shape = (2, self.slots)
        self._acc = np.zeros((*shape, self.values), np.int64)
        self._phase = np.array([[-2] * self.slots, [-1] * self.slots], np.int64)
        self._seen = np.zeros(shape, np.uint64)
        self._nseen = np.zeros(shape, np.int64)
        self._exp = np.full(shape, EMPTY, np.int64)
        self._off = np.zeros(shape, np.int64)
        self._cnt = np.zeros(shape, np.int64)
        self._res = np.zeros((*shape, HEADER.size + 4 * self.values), np.uint8)
        self._free = list(range(self.slots - 1, -1, -1))
        self._jobs: dict[int, Job] = {}
        self._table: tuple | None = None
        self._session = 0
        self._full = (1 << self.nworkers) - 1

    @property
    def free_slots(self) -> int:
        """Slots not granted to any job."""
        return len(self._free)

    def handle(self, data: bytes, addr: Address, now: float | None = None
               ) -> list[tuple[bytes, Address]]:
        """Process one datagram from ``addr``; returns the datagrams to send (the reference,
        in Python, of what :meth:`handle_batch` does compiled)."""
        self.stats.datagrams += 1
        return self._handle(data, addr, time.monotonic() if now is None else now)

    def _handle(self, data: bytes, addr: Address, now: float) -> list[tuple[bytes, Address]]:
        try:
            h, payload = unpack(data)
        except InaProtocolError as e:
            self.stats.malformed += 1
            self.stats.last_error = f"from {addr[0]}:{addr[1]}: {e}"
            notice = version_notice(data) if isinstance(e, InaVersionError) else None
            return [] if notice is None else [(notice, addr)]
        reason = self._check(h)
        if reason is not Reason.NONE:
            return self._reject(h, reason, addr)
        if h.kind is Kind.JOIN:
            return self._join(h, bytes(payload), addr, now)
        if h.kind is Kind.LEAVE:
            return self._leave(h, addr, now)
        return self._data(h, payload, addr, now)

    def expire(self, now: float | None = None) -> list[int]:
        """Free the jobs idle for longer than ``lease``; returns their ids."""
        now = time.monotonic() if now is None else now
        old = [j for j, job in self._jobs.items() if now - job.active > self.lease]
        for j in old:
            self._free.extend(self._jobs.pop(j).slots)
        self._table = None if old else self._table
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

    def _join(self, h: Header, payload: bytes, addr: Address, now: float
              ) -> list[tuple[bytes, Address]]:
        job = self._jobs.get(h.job)
        if job is not None and job.joined == self._full and job.calls[h.worker] != h.phase:
            # the worker's next call: it has left this session (its LEAVE may have been lost)
            job.waiting[h.worker] = (h, payload, addr)  # taken up once the old one is freed
            job.active = now
            return self._leave(h._replace(session=job.session), addr, now)
        if job is None:
            grant = min(max(1, h.slot), len(self._free))
            self._session = self._session % 65535 + 1
            job = Job(self._session, [self._free.pop() for _ in range(grant)],
                      [None] * self.nworkers, [0] * self.nworkers, [0] * self.nworkers)
            for g in job.slots:
                self._phase[0][g], self._phase[1][g] = -2, -1
                self._nseen[0][g] = self._nseen[1][g] = 0
            self._jobs[h.job] = job
            self._table = None
            self.stats.sessions += 1
            self.stats.refused += not grant
        job.active = now
        job.addrs[h.worker] = addr
        job.groups[h.worker] = h.offset
        job.calls[h.worker] = h.phase
        was = job.joined
        job.joined |= 1 << h.worker
        if was != self._full:
            job.keep_first_exponents(h, payload, self.values)
        if job.joined != self._full:
            return []
        if was != self._full:
            self._agree(job)
        to = range(self.nworkers) if was != self._full else [h.worker]
        if not job.slots:
            peers = pack_peers(job.addrs)
            return [(pack(Header(Kind.NOSLOT, h.job, job.session, w, self.nworkers, 0,
                                 self.nworkers), peers), job.addrs[w])
                    for w in to]
        return [(pack(Header(Kind.JOINED, h.job, job.session, w, self.nworkers,
                             len(job.slots), self.values), job.first),
                 job.addrs[w]) for w in to]

    def _agree(self, job: Job) -> None:
        """Once all have joined: the job's multicast group, and when every JOIN carried the
        first exponents, the slots' phase 0 as done with their maxima (the JOINED payload)."""
        if len(set(job.groups)) == 1:
            job.group = group_address(job.groups[0])
        if len(job.exps) < self.nworkers:
            return
        maxima = np.max(list(job.exps.values()), axis=0)
        job.first = maxima.astype(WIRE).tobytes()
        for g, e in zip(job.slots, maxima, strict=True):
            self._phase[0][g], self._seen[0][g] = 0, np.uint64(self._full)
            self._nseen[0][g], self._exp[0][g] = self.nworkers, e

    def _leave(self, h: Header, addr: Address, now: float) -> list[tuple[bytes, Address]]:
        job = self._jobs.get(h.job)
        if job is None or job.session != h.session:
            return [(pack(Header(Kind.LEFT, h.job, h.session, h.worker, self.nworkers)), addr)]
        job.addrs[h.worker] = addr
        job.left |= 1 << h.worker
        if job.left != self._full:
            return []
        del self._jobs[h.job]
        self._table = None
        self._free.extend(job.slots)
        out = [(pack(Header(Kind.LEFT, h.job, h.session, w, self.nworkers)), job.addrs[w])
               for w in range(self.nworkers)]
        for joins, payload, at in job.waiting.values():
            out += self._join(joins, payload, at, now)
        return out

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
        current = int(self._phase[v, g])
        row = self._acc[v, g]
        if h.phase == current:
            if int(self._seen[v, g]) & bit:
                self.stats.duplicates += 1
                if self._nseen[v, g] == self.nworkers:
                    return [(self._reply(h, v, g, h.worker), addr)]
                return []
            if (self._off[v, g], self._cnt[v, g]) != (h.offset, h.count):
                return self._reject(h, Reason.BAD_PHASE, addr)
            row[:h.count] += np.frombuffer(payload, WIRE)
            self._seen[v, g] |= np.uint64(bit)
            self._nseen[v, g] += 1
            self._exp[v, g] = max(self._exp[v, g], h.exp)
        elif h.phase == current + 2 and (h.phase < 1 or (
                self._phase[1 - v, g] == h.phase - 1
                and self._nseen[1 - v, g] == self.nworkers)):
            row[:h.count] = np.frombuffer(payload, WIRE)
            self._phase[v, g] = h.phase
            self._seen[v, g] = bit
            self._nseen[v, g] = 1
            self._exp[v, g] = h.exp
            self._off[v, g], self._cnt[v, g] = h.offset, h.count
        elif h.phase < current:
            self.stats.stale += 1
            return []
        else:
            return self._reject(h, Reason.BAD_PHASE, addr)
        self.stats.aggregated += 1
        if self._nseen[v, g] < self.nworkers:
            return []
        self.stats.results += 1
        total = row[:h.count]
        if total.size and (total.min() < _LO or total.max() > _HI):
            self.stats.saturated += 1
            total = np.clip(total, _LO, _HI)
        self._res[v, g, HEADER.size:HEADER.size + 4 * h.count] = np.frombuffer(
            total.astype(WIRE).tobytes(), np.uint8)
        if job.group is not None:
            self.stats.multicast += 1
            return [(self._reply(h, v, g, GROUP), job.group)]
        return [(self._reply(h, v, g, w), job.addrs[w]) for w in range(self.nworkers)]

    def _reply(self, h: Header, v: int, g: int, worker: int) -> bytes:
        payload = self._res[v, g, HEADER.size:HEADER.size + 4 * h.count].tobytes()
        return pack(Header(Kind.RESULT, h.job, h.session, worker, self.nworkers, h.slot,
                           h.count, int(self._exp[v, g]), h.phase, h.offset, v), payload)

    def handle_batch(self, batch: Batch, count: int, now: float | None = None
                     ) -> Iterator[tuple[memoryview | bytes, Address]]:
        """Process the first ``count`` datagrams of ``batch`` in order, as :meth:`handle`
        would one by one, with the compiled kernel for the DATA stream; yields what to send.
        A yielded view is reused: send it before taking the next."""
        now = time.monotonic() if now is None else now
        self.stats.datagrams += count
        jobs, sessions, grants, ngrants, ids = self._job_table()
        touched = np.zeros(len(ids), np.int64)
        done = 0
        while done < count:
            stop = _kernels.switch_batch(
                batch.buf, batch.lens, done, count, self.nworkers, self.values, jobs,
                sessions, grants, ngrants, touched, self._phase, self._seen, self._nseen,
                self._exp, self._off, self._cnt, self._acc, self._res, batch.counters,
                batch.code, batch.where)
            for i in np.flatnonzero(batch.code[done:stop]) + done:
                v, g = divmod(int(batch.where[i]), self.slots)
                whole = memoryview(self._res[v, g])
                reply = whole[:HEADER.size + 4 * int.from_bytes(whole[18:20], "big")]
                if batch.code[i] == _kernels.TO_SENDER:
                    whole[12:14] = batch.buf[i, 12:14].tobytes()
                    yield reply, batch.addrs[i]
                    continue
                job = self._jobs[int.from_bytes(whole[8:10], "big")]
                if job.group is not None:
                    self.stats.multicast += 1
                    whole[12:14] = GROUP.to_bytes(2, "big")
                    yield reply, job.group
                    continue
                for w in range(self.nworkers):
                    whole[12:14] = w.to_bytes(2, "big")
                    yield reply, job.addrs[w]
            if stop < count:
                data = batch.buf[stop, :batch.lens[stop]].tobytes()
                yield from self._handle(data, batch.addrs[stop], now)
                jobs, sessions, grants, ngrants, ids = self._job_table()
                touched = np.zeros(len(ids), np.int64)
            done = stop + 1
            for k in np.flatnonzero(touched):
                self._jobs[ids[k]].active = now
        c = batch.counters
        self.stats.aggregated += int(c[_kernels.AGGREGATED])
        self.stats.results += int(c[_kernels.RESULTS])
        self.stats.duplicates += int(c[_kernels.DUPLICATES])
        self.stats.stale += int(c[_kernels.STALE])
        self.stats.saturated += int(c[_kernels.SATURATED])
        c[:] = 0

    def _job_table(self) -> tuple:
        """The jobs holding slots as arrays for the kernel (rebuilt when jobs change)."""
        if self._table is None:
            self._table = grant_table(self._jobs)
        return self._table
