"""A worker's data stream through the switch's granted slots (see :mod:`commflow.ina.worker`):
the datagrams waiting are read in a batch, and one compiled call
(:func:`commflow.ina._stream_kernels.take_results`) decodes the results and builds the next
packets; Python sends them and keeps the retransmission timers."""

from __future__ import annotations

import heapq
import threading
import time

import numpy as np

from commflow.ina import _stream_kernels as K
from commflow.ina._batch import Batch
from commflow.ina._common import Rto
from commflow.ina.protocol import (
    HEADER,
    Header,
    InaProtocolError,
    InaTimeoutError,
    Kind,
    shift,
    unpack,
)

_scratch = threading.local()


def _buffers(k: int, values: int) -> tuple[np.ndarray, Batch]:
    """This thread's packet buffers (one per slot) and receive batch, kept from its last call
    of the same shape: no fresh pages to fault in while every worker starts its stream."""
    got = getattr(_scratch, "buffers", None)
    if got is None or got[0].shape != (k, HEADER.size + 4 * values):
        got = _scratch.buffers = (np.zeros((k, HEADER.size + 4 * values), np.uint8),
                                  Batch(min(64, 2 * k)))
    return got


def first_exponents(flat: np.ndarray, values: int, count: int) -> np.ndarray:
    """The exponents of ``flat``'s first ``count`` blocks of ``values`` (what a JOIN carries
    so that the switch agrees on them before the stream: no phase 0)."""
    bits, mbits, bias, mask = K.float_bits(flat)
    return K.first_exponents(bits, values, count, mbits, bias, mask)


def stream(link, flat: np.ndarray, out: np.ndarray, joined: Header, nranks: int,
           timeout: float, rto: Rto, first: np.ndarray | None = None) -> int | None:
    """Aggregate the 1-D ``flat`` into ``out`` (same size) through the slots ``joined``
    grants on ``link`` (a :class:`commflow.ina.worker._Link`); ``first``: the agreed exponent
    of each slot's first block, when JOINED brought them (the stream starts at phase 1), else
    phase 0 agrees on them. Returns the first block whose sum holds inf or nan (a rank's
    array had them), else ``None``."""
    values = joined.count
    nblocks = -(-flat.size // values)
    k = min(joined.slot, nblocks)
    ident = np.array([joined.job, joined.session, joined.worker, nranks, shift(nranks),
                      values, k, nblocks], np.int64)
    bits, mbits, bias, mask = K.float_bits(flat)
    last = np.array([len(range(s, nblocks, k)) for s in range(k)], np.int64)
    phase = np.zeros(k, np.int64)
    agreed = np.full(k, K.EMPTY, np.int64)
    if first is not None:
        phase[:], agreed[:] = 1, first[:k]
    packets, batch = _buffers(k, values)
    views = [memoryview(p) for p in packets]
    sizes = np.zeros(k, np.int64)
    counters = np.zeros(5, np.int64)
    sent_at, again = [0.0] * k, [False] * k
    timers: list[tuple[float, int, int]] = []

    def send(s: int, now: float) -> None:
        sent_at[s], again[s] = now, False
        link.send(views[s][:sizes[s]])
        heapq.heappush(timers, (now + rto.value, s, int(phase[s])))

    now = time.monotonic()
    for s in range(k):
        K.fill(s, ident, phase, agreed, flat, bits, mbits, bias, mask, packets, sizes)
        send(s, now)
    remaining, progress = k, now
    while remaining:
        count = link.receive_batch(batch)
        now = time.monotonic()
        if not count:
            while timers and timers[0][0] <= now:
                _, s, j = heapq.heappop(timers)
                if phase[s] == j:
                    rto.backoff(now)
                    again[s] = True
                    link.stats.retransmits += 1
                    link.send(views[s][:sizes[s]])
                    heapq.heappush(timers, (now + rto.value, s, j))
            if now - progress > timeout:
                waiting = [s for s in range(k) if phase[s] <= last[s]]
                raise InaTimeoutError(
                    f"{link.who}: no result for {timeout:.1f} s (slots {waiting[:8]} at "
                    f"phases {[int(phase[s]) for s in waiting[:8]]}); a worker may have died "
                    f"or the switch at {link.switch[0]}:{link.switch[1]} stopped")
            link.wait(min(timers[0][0] if timers else now + 0.1, progress + timeout) - now)
            continue
        K.take_results(batch.buf, batch.lens, count, ident, phase, last, agreed, out, flat,
                       bits, mbits, bias, mask, packets, sizes, batch.code, batch.where,
                       counters)
        for i in np.flatnonzero(batch.code[:count]):
            c, s = batch.code[i], int(batch.where[i])
            if c == K.OTHER:
                _other(link, batch, i, joined)
            elif c == K.BAD_BLOCK:
                h = unpack(batch.views[i][:batch.lens[i]])[0]
                raise InaProtocolError(f"{link.who}: result for slot {s} phase {h.phase} "
                                       f"covers [{h.offset}, +{h.count}), expected "
                                       f"[{(s + (h.phase - 1) * k) * values}, ...)")
            else:
                if not again[s]:
                    rto.sample(now - sent_at[s])
                progress = now
                if c == K.SEND:
                    send(s, now)
                else:
                    remaining -= 1
    stats = link.stats
    stats.results += int(counters[K.RESULTS])
    stats.group_results += int(counters[K.GROUP_RESULTS])
    stats.duplicates += int(counters[K.DUPLICATES])
    stats.malformed += int(counters[K.MALFORMED])
    first = int(counters[K.FIRST_NONFINITE])
    return first - 1 if first else None


def _other(link, batch: Batch, i: int, joined: Header) -> None:
    """A valid datagram that is not a RESULT: a REJECT of this session raises, the rest are
    counted as malformed."""
    try:
        h = unpack(batch.views[i][:batch.lens[i]])[0]
    except InaProtocolError:
        link.stats.malformed += 1
        return
    if h.kind is Kind.REJECT and h.session == joined.session:
        raise link.refused(h, f"DATA of slot {h.slot} phase {h.phase}")
    link.stats.malformed += 1
