"""The end-host ring over lossy UDP (the switch's baseline): sums vs numpy, loss, timeouts."""

import numpy as np
import pytest

from commflow.ina import Faults, InaTimeoutError, WorkerStats
from commflow.ina._sockets import open_socket
from commflow.ina.ring import udp_ring_allreduce

from .conftest import on_threads


def ring(xs, *, drop=0.0, dup=0.0, calls=1, **kwargs):
    n = len(xs)
    socks = [open_socket("127.0.0.1", 0) for _ in range(n)]
    peers = [s.getsockname() for s in socks]
    stats = [WorkerStats() for _ in range(n)]

    def work(r):
        out = None
        for call in range(calls):
            out = udp_ring_allreduce(
                xs[r], socks[r], peers, rank=r, call=call, stats=stats[r],
                faults=Faults(drop=drop, duplicate=dup, seed=10 * r + call), **kwargs)
        return out

    try:
        outs = on_threads(work, n, timeout=60)
    finally:
        for s in socks:
            s.close()
    return outs, stats


@pytest.mark.parametrize("n, size, drop, dup", [(2, 10_001, 0.0, 0.0), (3, 7, 0.05, 0.0),
                                                (4, 50_000, 0.05, 0.1), (4, 0, 0.0, 0.0),
                                                (1, 5, 0.0, 0.0)])
def test_sum_matches_numpy(n, size, drop, dup):
    rng = np.random.default_rng(size)
    xs = [(rng.standard_normal(size) * 1e3).astype(np.float32) for _ in range(n)]
    outs, stats = ring(xs, drop=drop, dup=dup, calls=2, values=500)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    # each hop rounds the partial sum to float32 (the wire), at most n - 1 roundings
    bound = (n - 1) * np.spacing(np.sum(np.abs(xs), axis=0, dtype=np.float32))
    for out in outs:
        assert out.dtype == np.float32
        assert (np.abs(out - exact) <= bound + np.spacing(np.abs(exact).astype(np.float32))).all()
    if drop and size > 100:
        assert sum(s.retransmits for s in stats) > 0


def test_float64_sums_exactly_in_ring_order():
    xs = [np.array([1e16, 1.0, -3.5]), np.array([1.0, 2.0**-40, 0.25]), np.array([-1e16, 0, 0])]
    outs, _ = ring(xs)
    for out in outs:
        assert out[1] == 1.0 + 2.0**-40 and out[2] == -3.25
        assert abs(out[0]) <= 2.0


def test_dead_neighbour_times_out():
    with pytest.raises(InaTimeoutError, match=r"udp ring rank 0: no progress for 0.5 s at send "
                                              r"step 1/2 with 1 packets unacknowledged"):
        sock, other = open_socket("127.0.0.1", 0), open_socket("127.0.0.1", 0)
        try:
            udp_ring_allreduce(np.ones(4), sock, [sock.getsockname(), other.getsockname()],
                               rank=0, timeout=0.5)
        finally:
            sock.close()
            other.close()
