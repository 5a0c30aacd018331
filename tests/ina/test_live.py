"""Workers (threads) and a switch process on loopback: sums vs numpy within
the protocol's bound, under loss and duplication; refusals and timeouts are clear errors."""

import socket
import threading
import time

import numpy as np
import pytest

from commflow.ina import (
    InaError,
    InaProtocolError,
    InaTimeoutError,
    InaVersionError,
    error_bound,
    ina_allreduce,
)
from commflow.ina.protocol import Header, Kind, pack
from tests.ina.conftest import allreduce_threads, on_threads


def arrays(n, size, dtype, seed):
    """Mixed signs and magnitudes from 1e-6 to 1e6, zero blocks and a lone huge value."""
    rng = np.random.default_rng(seed)
    xs = []
    for _ in range(n):
        x = rng.standard_normal(size) * 10.0 ** rng.integers(-6, 7, size)
        x[256:512] = 0.0
        x[-1] = -3.0e9
        xs.append(x.astype(dtype))
    return xs


def check(outs, xs, values=256):
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    bound = error_bound(xs, values)
    if xs[0].dtype == np.float32:
        bound = bound + np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    for out in outs:
        assert out.dtype == xs[0].dtype and out.shape == xs[0].shape
        assert (np.abs(out.astype(np.float64) - exact) <= bound).all()
    assert (outs[0][256:512] == 0).all()


@pytest.mark.parametrize("n, size, dtype", [(2, 10_007, np.float32), (4, 5_000, np.float64),
                                            (4, 1, np.float32)])
def test_sum_matches_numpy_within_the_bound(forked, n, size, dtype):
    sw = forked(n, 16)
    xs = arrays(n, max(size, 600), dtype, seed=n)
    if size == 1:
        xs = [np.array([x[0]], dtype) for x in xs]
    outs, stats = allreduce_threads(xs, sw.addr, slots=16)
    if size == 1:
        exact = sum(float(x[0]) for x in xs)
        assert all(abs(float(o[0]) - exact) <= error_bound(xs, 256)[0] + 1e-6 * abs(exact)
                   for o in outs)
    else:
        check(outs, xs)
    assert all(s.slots == 16 and s.results > 0 for s in stats)
    got = sw.stop()
    assert (got["sessions"], got["refused"], got["malformed"]) == (1, 0, 0)


@pytest.mark.parametrize("drop, dup", [(0.01, 0.0), (0.05, 0.0), (0.0, 0.2), (0.05, 0.1)])
def test_loss_and_duplication_in_both_directions(forked, drop, dup):
    n = 4
    sw = forked(n, 8, loss=drop, dup=dup)
    xs = arrays(n, 20_000, np.float32, seed=3)
    outs, stats = allreduce_threads(xs, sw.addr, drop=drop, dup=dup, slots=8, timeout=20)
    check(outs, xs)
    got = sw.stop()
    assert (got["dropped"] > 0) == (drop > 0) and (got["duplicated"] > 0) == (dup > 0)
    assert got["duplicates"] > 0 and got["rejected"] == 0
    if drop:
        assert sum(s.retransmits for s in stats) > 0
    if dup:
        assert sum(s.duplicates for s in stats) > 0


def test_consecutive_calls_and_shapes(forked):
    sw = forked(2, 4, values=100)
    rng = np.random.default_rng(5)
    for shape in [(3, 77), (0,), (1000,)]:
        xs = [rng.standard_normal(shape) for _ in range(2)]
        outs, stats = allreduce_threads(xs, sw.addr, slots=64)
        assert outs[0].shape == shape and stats[0].slots == 4
        exact = xs[0] + xs[1]
        assert (np.abs(outs[1] - exact) <= error_bound(xs, 100).reshape(shape)).all()
    assert sw.stop()["sessions"] == 3


def test_wrong_worker_count_is_refused_with_a_clear_error(forked):
    sw = forked(3)
    with pytest.raises(InaProtocolError, match="differs from the switch's -n"):
        ina_allreduce(np.ones(10), switch=sw.addr, rank=0, nranks=2, timeout=5)
    assert sw.stop()["rejected"] >= 1


def test_no_switch_times_out_naming_the_switch():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        addr = s.getsockname()
    start = time.monotonic()
    with pytest.raises(InaTimeoutError, match=rf"rank 0/2: no JOINED from the switch at "
                                              rf"127.0.0.1:{addr[1]}"):
        ina_allreduce(np.ones(10), switch=addr, rank=0, nranks=2, timeout=0.5)
    assert time.monotonic() - start < 3


def test_bad_switch_address_and_input_are_clear_errors():
    with pytest.raises(InaError, match=r"rank 0/2: bad switch address \('127.0.0.1', 'p'\)"):
        ina_allreduce(np.ones(3), switch=("127.0.0.1", "p"), rank=0, nranks=2)
    with pytest.raises(InaError, match="rank 1: float32 or float64 array expected, got int64"):
        ina_allreduce(np.ones(3, np.int64), switch=("127.0.0.1", 1), rank=1, nranks=2)


@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_inf_or_nan_on_one_rank_fails_every_rank_promptly_and_frees_the_slots(forked, bad):
    sw = forked(2, 4, values=100)
    xs = arrays(2, 1000, np.float32, seed=4)
    xs[1][745] = bad
    errors = []

    def call(x, **kwargs):
        try:
            return ina_allreduce(x, **kwargs)
        except InaError as e:
            errors.append(str(e))

    start = time.monotonic()
    allreduce_threads(xs, sw.addr, slots=4, call=call, timeout=10)
    assert time.monotonic() - start < 5
    assert sorted(e.split(": ", 1)[1] for e in errors) == [
        "a rank's array holds inf or nan in block 7 (elements [700, 800)), which cannot be "
        "quantized; the switch's sum of it is void"] * 2
    xs[1][745] = 0.5
    outs, _ = allreduce_threads(xs, sw.addr, slots=4)
    check(outs, xs, values=100)
    xs[0][250] = bad  # a slot's first block: its exponent goes in the JOIN
    errors.clear()
    allreduce_threads(xs, sw.addr, slots=4, call=call, timeout=10)
    assert sorted(e.split(": ", 1)[1] for e in errors) == [
        "a rank's array holds inf or nan in block 2 (elements [200, 300)), which cannot be "
        "quantized; the switch's sum of it is void"] * 2
    assert sw.stop()["sessions"] == 3


def test_out_takes_the_sum_in_place_or_preallocated(forked):
    sw = forked(3, 8, values=100)
    xs = arrays(3, 2500, np.float32, seed=5)
    ins = [x.copy() for x in xs]
    outs, _ = allreduce_threads(ins, sw.addr, slots=4,
                                call=lambda x, **kw: ina_allreduce(x, out=x, **kw))
    assert all(o is i for o, i in zip(outs, ins, strict=True))
    check(outs, xs, values=100)
    bufs = [np.full((50, 50), 7, np.float32) for _ in xs]
    outs, _ = allreduce_threads([x.reshape(50, 50) for x in xs], sw.addr, slots=4,
                                call=lambda x, **kw: ina_allreduce(x, out=bufs[kw["rank"]], **kw))
    assert all(o is b for o, b in zip(outs, bufs, strict=True))
    check([o.reshape(-1) for o in outs], xs, values=100)
    for bad in (np.empty(2500), np.empty(2499, np.float32), np.empty(5000, np.float32)[::2]):
        with pytest.raises(InaError, match=r"rank 0: out must be a writable C-contiguous "
                                           r"float32 array of shape \(2500,\)"):
            ina_allreduce(xs[0], switch=sw.addr, rank=0, nranks=3, out=bad)


def test_calls_in_a_row_on_one_thread_reuse_its_buffers_and_stay_exact(forked):
    sw = forked(2, 8, values=100)
    sizes = (2500, 250, 2500, 2500)  # 4 slots, 3 (3 blocks: other buffers), 4, 4 again
    xs = [arrays(2, size, np.float32, seed=size + i) for i, size in enumerate(sizes)]

    def work(rank):
        return [ina_allreduce(x[rank], switch=sw.addr, rank=rank, nranks=2, slots=4)
                for x in xs]

    outs = on_threads(work, 2)
    for i, x in enumerate(xs):
        check([outs[0][i], outs[1][i]], x, values=100)
    assert sw.stop()["sessions"] == 4


def test_garbage_at_the_switch_is_ignored(forked):
    sw = forked(2)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for junk in (b"", b"\x00" * 7, b"CFIN" + bytes(60), pack(Header(Kind.DATA, 0, count=9))):
            s.sendto(junk, sw.addr)
    xs = arrays(2, 3000, np.float64, seed=9)
    outs, _ = allreduce_threads(xs, sw.addr)
    check(outs, xs)
    got = sw.stop()
    assert got["malformed"] == 4 and "header says 9 values" in got["last_error"]


def test_a_switch_of_another_version_is_a_clear_error_not_a_timeout():
    """A switch that answers in another protocol version (as this one answers a worker of
    another version, ``protocol.version_notice``): the worker stops at its first answer."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sw:
        sw.bind(("127.0.0.1", 0))

        def answer():
            data, addr = sw.recvfrom(65536)
            sw.sendto(data[:4] + bytes([data[4] + 1]) + data[5:34], addr)

        thread = threading.Thread(target=answer)
        thread.start()
        start = time.monotonic()
        with pytest.raises(InaVersionError, match=r"speaks protocol version 3, this worker 2"):
            ina_allreduce(np.ones(8, np.float32), switch=sw.getsockname(), rank=0, nranks=2,
                          timeout=20.0)
        thread.join()
        assert time.monotonic() - start < 5.0


def test_two_jobs_share_the_pool(forked):
    sw = forked(2, 6)
    results = {}

    def job(j):
        xs = arrays(2, 4000, np.float32, seed=j)
        results[j] = (xs, *allreduce_threads(xs, sw.addr, job=j, slots=3))

    threads = [threading.Thread(target=job, args=(j,)) for j in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for xs, outs, stats in results.values():
        check(outs, xs)
        assert [s.slots for s in stats] == [3, 3]
    got = sw.stop()
    assert (got["sessions"], got["refused"]) == (2, 0)


def test_arrays_of_different_sizes_are_refused(forked):
    sw = forked(2)
    with pytest.raises(InaProtocolError, match="refused DATA of slot 3 phase 1: .* same size"):
        allreduce_threads([np.ones(1000), np.ones(1200)], sw.addr, timeout=2)
    assert sw.stop()["rejected"] >= 1
