"""The compiled paths agree bit for bit with the Python reference: the workers' kernels with
``protocol``'s numpy quantization, and ``Switch.handle_batch`` with ``Switch.handle`` on a
lossy, reordered, duplicated stream with protocol violations mixed in."""

import numpy as np
import pytest

from commflow.ina import _kernels
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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_worker_kernels_match_numpy(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 9, 1000)).astype(dtype)
    x[256:512] = 0
    got = np.empty(-(-x.size // 256), np.int64)
    _kernels.block_exponents(x, 256, got)
    assert got.tolist() == exponents(x.astype(np.float64), 256).tolist()
    assert got[1] == EMPTY
    q = shift(4)
    for lo, e in [(0, int(got[0])), (512, int(got[2])), (768, int(got[3])), (256, EMPTY)]:
        hi = min(lo + 256, x.size)
        pkt = np.zeros(HEADER.size + 4 * 256, np.uint8)
        _kernels.quantize_into(x, lo, hi, e, q, pkt)
        wire = quantize(x[lo:hi].astype(np.float64), e, q)
        assert pkt[HEADER.size:HEADER.size + len(wire)].tobytes() == wire
        out = np.full(x.size, 7, dtype)
        _kernels.dequantize_into(pkt, hi - lo, e, q, out, lo)
        ref = dequantize(memoryview(wire), e, q).astype(dtype)
        assert out[lo:hi].tobytes() == ref.tobytes()
        assert (np.delete(out, np.arange(lo, hi)) == 7).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_exponents_of_negative_subnormal_and_extreme_blocks(dtype):
    info = np.finfo(dtype)
    x = np.array([-5.5, 2.0,  # the largest magnitude is negative
                  0.0, -0.0,  # all zero: EMPTY
                  info.smallest_subnormal * 5, -info.smallest_subnormal,  # subnormal
                  -info.max, 1.0, info.tiny, 0.0, 3.0], dtype)
    got = np.empty(6, np.int64)
    _kernels.block_exponents(x, 2, got)
    assert got.tolist() == exponents(x.astype(np.float64), 2).tolist()
    assert got[:2].tolist() == [3, EMPTY]


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
