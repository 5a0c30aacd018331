"""Wire format and quantization: round trips, validation, and the error bound."""

import numpy as np
import pytest

from commflow.ina._common import Rto
from commflow.ina.protocol import (
    EMPTY,
    HEADER,
    Header,
    InaProtocolError,
    Kind,
    Reason,
    dequantize,
    error_bound,
    exponents,
    pack,
    pack_peers,
    quantize,
    shift,
    unpack,
    unpack_peers,
)


def test_header_round_trip():
    h = Header(Kind.DATA, job=7, session=3, worker=2, nworkers=4, slot=11, count=3, exp=-5,
               phase=9, offset=2**40, flags=1)
    payload = np.array([1, -2, 2**30], ">i4").tobytes()
    data = pack(h, payload)
    assert len(data) == HEADER.size + 12 == 46
    got, body = unpack(data)
    assert got == h and got.ver == 1
    assert np.frombuffer(body, ">i4").tolist() == [1, -2, 2**30]


@pytest.mark.parametrize("data, message", [
    (b"CFIN", "shorter than the 34-byte header"),
    (b"XXXX" + bytes(30), "bad magic"),
    (pack(Header(Kind.JOIN, 0))[:4] + b"\x09" + bytes(29), "protocol version 9"),
    (pack(Header(Kind.DATA, 0, count=2)) + bytes(4), "header says 2 values but 4 payload"),
    (pack(Header(Kind.JOIN, 0)) + bytes(4), "header says 0 values but 4 payload"),
    (pack(Header(Kind.JOIN, 0))[:5] + b"\x63" + bytes(28), "unknown kind 99"),
    (pack(Header(Kind.JOIN, 0, flags=4)), "unknown flags"),
])
def test_malformed_datagrams_raise(data, message):
    with pytest.raises(InaProtocolError, match=message):
        unpack(data)


def test_noslot_lists_the_workers_addresses():
    peers = [("127.0.0.1", 40000), ("10.0.0.2", 65535)]
    h, payload = unpack(pack(Header(Kind.NOSLOT, 1, count=2), pack_peers(peers)))
    assert unpack_peers(payload, h.count) == peers
    with pytest.raises(InaProtocolError, match="header says 3 values but 12 payload bytes"):
        unpack(pack(Header(Kind.NOSLOT, 1, count=3), pack_peers(peers)))


def test_reject_carries_reason():
    got, _ = unpack(pack(Header(Kind.REJECT, 1, reason=Reason.BAD_SLOT)))
    assert got.reason is Reason.BAD_SLOT


def test_shift_keeps_the_sum_of_n_workers_in_int32():
    for n in (1, 2, 3, 4, 5, 8, 64):
        assert n * 2 ** shift(n) <= 2**30
    assert [shift(n) for n in (1, 2, 3, 4, 5)] == [30, 29, 28, 28, 27]


def test_exponents_bound_the_block_and_mark_zero_blocks():
    x = np.array([0.5, -3.0, 0.0, 0.0, 1e-300, 0.0, 7.0])
    e = exponents(x, 2)
    assert e.tolist() == [2, EMPTY, -996, 3]
    assert (np.abs(x[:2]).max() < 2.0 ** e[0]) and 2.0 ** (e[0] - 1) <= 3.0


def test_quantized_sum_is_within_the_bound():
    rng = np.random.default_rng(1)
    n, values = 4, 64
    xs = [rng.standard_normal(1000) * 10.0 ** rng.integers(-30, 30, 1000) for _ in range(n)]
    e = np.max([exponents(x, values) for x in xs], axis=0)
    q = shift(n)
    total = np.zeros(1000)
    for b, exp in enumerate(e.tolist()):
        sl = slice(b * values, (b + 1) * values)
        ints = sum(np.frombuffer(quantize(x[sl], exp, q), ">i4").astype(np.int64) for x in xs)
        assert np.abs(ints).max() <= 2**30
        total[sl] = dequantize(memoryview(ints.astype(">i4").tobytes()), exp, q)
    exact = np.sum(xs, axis=0)
    bound = error_bound(xs, values)
    assert (np.abs(total - exact) <= bound).all()
    padded = [np.pad(np.abs(x), (0, 24)).reshape(-1, values).max(1) for x in xs]
    blockmax = np.repeat(np.max(padded, axis=0), values)[:1000]
    assert (bound > 0).all() and (bound <= n * 2.0 ** -q * blockmax).all()


def test_retransmission_timeout_starts_within_its_bounds_and_follows_rfc6298():
    assert Rto(0.05, 2.0, 5.0).value == 2.0  # a floor above the start holds from the first send
    assert Rto(0.05, 0.01, 0.03).value == 0.03
    rto = Rto(0.05, 0.001, 1.0)
    rto.sample(0.010)  # srtt 10 ms, var 5 ms: 10 + 4 * 5
    assert rto.value == pytest.approx(0.030)
    rto.sample(0.018)  # var 0.75 * 5 + 0.25 * 8 = 5.75, srtt 11: 11 + 23
    assert rto.value == pytest.approx(0.034)
    rto.backoff(now=100.0)
    assert rto.value == pytest.approx(0.068)
    rto.backoff(now=100.01)  # the same loss event: not doubled again
    assert rto.value == pytest.approx(0.068)
