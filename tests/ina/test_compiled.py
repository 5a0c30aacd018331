"""The compiled paths agree bit for bit with the Python reference: the workers' stream kernels
with ``protocol``'s numpy quantization (and count duplicates and bad datagrams in a batch),
and ``Switch.handle_batch`` with ``Switch.handle`` on a lossy, reordered, duplicated stream
with protocol violations mixed in."""

import numpy as np
import pytest

from commflow.ina import _stream_kernels as K
from commflow.ina._batch import Batch
from commflow.ina.protocol import (
    EMPTY,
    GROUP,
    HEADER,
    Header,
    Kind,
    dequantize,
    exponents,
    group_field,
    pack,
    quantize,
    shift,
    unpack,
)
from commflow.ina.switch import Switch


def _blocks(x: np.ndarray, values: int) -> list[int]:
    bits, *fmt = K.float_bits(x)
    return [K.block_exponent(bits, lo, min(lo + values, x.size), *fmt)
            for lo in range(0, x.size, values)]


def _result(ident, s, phase, exp, offset, ints, worker=None, session=None) -> bytes:
    h = Header(Kind.RESULT, int(ident[K.JOB]), int(ident[K.SESSION]) if session is None
               else session, int(ident[K.WORKER]) if worker is None else worker,
               int(ident[K.NRANKS]), s, len(ints), exp, phase, offset, phase & 1)
    return pack(h, np.asarray(ints, ">i4").tobytes())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_worker_stream_kernels_match_numpy_under_duplicates_and_bad_datagrams(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 9, 1000)).astype(dtype)
    x[256:512] = 0
    e = _blocks(x, 256)
    assert e == exponents(x.astype(np.float64), 256).tolist() and e[1] == EMPTY
    k, q = 2, shift(4)
    ident = np.array([1, 9, 3, 4, q, 256, k, 4], np.int64)  # job, session, worker 3 of 4
    bits, *fmt = K.float_bits(x)
    phase, last = np.zeros(k, np.int64), np.array([2, 2], np.int64)
    agreed = np.full(k, EMPTY, np.int64)
    packets, sizes = np.zeros((k, HEADER.size + 4 * 256), np.uint8), np.zeros(k, np.int64)
    out = np.full(x.size, 7, dtype)
    code, slot, counters = np.zeros(8, np.int64), np.zeros(8, np.int64), np.zeros(5, np.int64)
    for s in range(k):
        K.fill(s, ident, phase, agreed, x, bits, *fmt, packets, sizes)
        assert packets[s, :sizes[s]].tobytes() == pack(Header(Kind.DATA, 1, 9, 3, 4, s, 0,
                                                              e[s], 0, 0))
    # phase-0 results agree on exponents e + 1 (other workers' larger blocks); then a
    # duplicate, another session's result, a REJECT and a RESULT for the wrong block
    batch = [_result(ident, 0, 0, e[0] + 1, 0, []), _result(ident, 1, 0, e[1], 0, [],
                                                            worker=GROUP),
             _result(ident, 0, 0, e[0] + 1, 0, []), _result(ident, 1, 1, 0, 256, [], session=8),
             pack(Header(Kind.REJECT, 1, 9, 3, 4, 0)), b"CFIN junk"]
    buf, lens = np.zeros((8, 2048), np.uint8), np.zeros(8, np.int64)
    for i, d in enumerate(batch):
        buf[i, :len(d)], lens[i] = np.frombuffer(d, np.uint8), len(d)
    K.take_results(buf, lens, len(batch), ident, phase, last, agreed, out, x, bits, *fmt,
                   packets, sizes, code, slot, counters)
    assert code[:6].tolist() == [K.SEND, K.SEND, K.NONE, K.NONE, K.OTHER, K.NONE]
    assert counters.tolist() == [2, 1, 1, 2, 0] and phase.tolist() == [1, 1]
    for s, agree, nxt in ((0, e[0] + 1, e[2]), (1, EMPTY, e[3])):
        block = x[256 * s:256 * (s + 1)].astype(np.float64)
        assert packets[s, :sizes[s]].tobytes() == pack(
            Header(Kind.DATA, 1, 9, 3, 4, s, 256, nxt, 1, 256 * s, 1),
            quantize(block, agree, q))
    sums = [rng.integers(-2**28, 2**28, 256), np.zeros(256, np.int64)]
    results = [_result(ident, s, 1, e[2 + s], 256 * s, sums[s]) for s in (1, 0)]
    results.append(_result(ident, 1, 2, 0, 999, np.zeros(232)))
    for i, d in enumerate(results):
        buf[i, :len(d)], lens[i] = np.frombuffer(d, np.uint8), len(d)
    K.take_results(buf, lens, 3, ident, phase, last, agreed, out, x, bits, *fmt, packets, sizes,
                   code, slot, counters)
    assert code[:3].tolist() == [K.SEND, K.SEND, K.BAD_BLOCK] and slot[:3].tolist() == [1, 0, 1]
    for s, agree in ((0, e[0] + 1), (1, EMPTY)):
        wire = np.asarray(sums[s], ">i4").tobytes()
        assert out[256 * s:256 * (s + 1)].tobytes() == dequantize(
            memoryview(wire), agree, q).astype(dtype).tobytes()
    assert (out[512:] == 7).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_exponents_of_negative_subnormal_extreme_and_nonfinite_blocks(dtype):
    info = np.finfo(dtype)
    x = np.array([-5.5, 2.0,  # the largest magnitude is negative
                  0.0, -0.0,  # all zero: EMPTY
                  info.smallest_subnormal * 5, -info.smallest_subnormal,  # subnormal
                  -info.max, 1.0, info.tiny, 0.0, 3.0], dtype)
    assert _blocks(x, 2) == exponents(x.astype(np.float64), 2).tolist()
    assert _blocks(x, 2)[:2] == [3, EMPTY]
    for bad in (np.inf, -np.inf, np.nan):
        y = x.copy()
        y[7] = bad
        assert _blocks(y, 2) == [3, EMPTY, _blocks(x, 2)[2], K.NONFINITE, *_blocks(x, 2)[4:]]


N, SLOTS, VALUES = 3, 4, 8
ADDRS = [("127.0.0.1", 6000 + w) for w in range(N)]


class Workers:
    """Honest workers of job 1 (3 slots each, 5 phases per slot) whose packets and the
    switch's answers a lossy network drops, duplicates, delays and reorders."""

    def __init__(self, rng: np.random.Generator, session: int) -> None:
        self.rng, self.session = rng, session
        self.phase = np.zeros((N, 3), np.int64)
        self.values = rng.integers(-2**20, 2**20, (N, 3, 6, VALUES))
        self.values[:, 0, 2] = 2**30  # a sum beyond int32: clipped, counted as saturated
        self.old: list[tuple[bytes, tuple]] = []

    def packet(self, w: int, s: int) -> bytes:
        j = int(self.phase[w, s])
        count = 0 if j == 0 else VALUES - (s == 2)
        h = Header(Kind.DATA, 1, self.session, w, N, s, count, int(self.rng.integers(-5, 5)),
                   j, 100 * s + 10 * j, j & 1)
        return pack(h, self.values[w, s, j, :count].astype(">i4").tobytes())

    def sends(self) -> list[tuple[bytes, tuple]]:
        out = []
        for w in range(N):
            for s in range(3):
                if self.phase[w, s] < 6 and self.rng.random() < 0.5:
                    out.append((self.packet(w, s), ADDRS[w]))
        noise = [(b"junk", ADDRS[0]),
                 (pack(Header(Kind.DATA, 1, self.session, 0, N, 7, 0)), ADDRS[0]),
                 (pack(Header(Kind.DATA, 9, 1, 0, N, 0, 0)), ADDRS[1]),
                 (pack(Header(Kind.DATA, 1, self.session, 1, N, 1, 0, 0, 9, 0, 1)), ADDRS[1])]
        if self.rng.random() < 0.3:
            out.append(noise[self.rng.integers(len(noise))])
        if self.old and self.rng.random() < 0.3:  # a late copy of an old phase
            out.append(self.old[self.rng.integers(len(self.old))])
        self.old += out
        out += [out[i] for i in range(len(out)) if self.rng.random() < 0.2]
        self.rng.shuffle(out)
        return [p for p in out if self.rng.random() > 0.1]

    def receive(self, replies: list[tuple[bytes, tuple]]) -> None:
        for data, _ in replies:
            h, _ = unpack(data)
            for w in range(N) if h.worker == GROUP else [h.worker]:
                if (h.kind is Kind.RESULT and self.rng.random() > 0.1
                        and h.phase == self.phase[w, h.slot]):
                    self.phase[w, h.slot] += 1


@pytest.mark.parametrize("group", [None, ("239.255.18.3", 7000)])
def test_switch_batch_matches_the_reference_under_loss_and_duplication(group):
    rng = np.random.default_rng(11)
    ref, fast = Switch(N, SLOTS, values=VALUES), Switch(N, SLOTS, values=VALUES)
    for sw in (ref, fast):
        sw.handle(pack(Header(Kind.JOIN, 5, 0, 0, N, 1)), ADDRS[0], now=0.0)
        for w in range(N):
            sw.handle(pack(Header(Kind.JOIN, 1, 0, w, N, 3, offset=group_field(group))),
                      ADDRS[w], now=0.0)
    workers = Workers(rng, session=2)
    batch = Batch(16)
    rounds, multicast_to = 0, set()
    while (workers.phase < 6).any():
        rounds += 1
        assert rounds < 2000, "the simulated stream made no progress"
        packets = workers.sends()[:16]
        expected = [(bytes(d), a) for p, addr in packets for d, a in ref.handle(p, addr, 1.0)]
        for i, (p, addr) in enumerate(packets):
            batch.buf[i, :len(p)] = np.frombuffer(p, np.uint8)
            batch.lens[i], batch.addrs[i] = len(p), addr
        got = [(bytes(d), a) for d, a in fast.handle_batch(batch, len(packets), 1.0)]
        assert got == expected
        multicast_to |= {a for d, a in expected if unpack(d)[0].worker == GROUP}
        workers.receive(expected)
    assert fast.stats == ref.stats
    assert ref.stats.saturated == 1 and ref.stats.duplicates > 10 and ref.stats.stale > 0
    assert ref.stats.rejected > 0 and ref.stats.malformed > 0 and ref.stats.results == 18
    assert ref.stats.multicast == (18 if group else 0)
    assert multicast_to == ({group} if group else set())
    for sw in (ref, fast):
        out = [r for w in range(N)
               for r in sw.handle(pack(Header(Kind.LEAVE, 1, 2, w, N)), ADDRS[w], now=2.0)]
        assert [unpack(d)[0].kind for d, _ in out] == [Kind.LEFT] * N
    assert fast.free_slots == ref.free_slots == SLOTS - 1
