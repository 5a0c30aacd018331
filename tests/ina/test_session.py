"""Sessions without a closing barrier: a worker returns once its results are in, its LEAVE
may be lost, and its next call's JOIN (a new call id) stands in for it; the switch holds that
JOIN while another worker still needs the old session's results."""

import threading
import time

import numpy as np

from commflow.ina import Faults, WorkerStats, error_bound, ina_allreduce, run_switch
from commflow.ina._stream_kernels import NONFINITE
from commflow.ina.protocol import EMPTY, Header, Kind, Reason, pack, unpack
from commflow.ina.switch import Switch
from tests.ina.conftest import on_threads

ADDRS = [("127.0.0.1", 6000 + w) for w in range(2)]
NEW = [("127.0.0.1", 7000 + w) for w in range(2)]


def send(sw, h, addr, payload=b""):
    return [(unpack(d)[0], np.frombuffer(unpack(d)[1], ">i4").tolist(), a)
            for d, a in sw.handle(pack(h, payload), addr, now=0.0)]


def datum(sw, w, phase, value, addr, session=1):
    h = Header(Kind.DATA, 1, session, w, 2, 0, 1, 3, phase, 0, phase & 1)
    return send(sw, h, addr, np.array([value], ">i4").tobytes())


def join(sw, w, call, addr):
    return send(sw, Header(Kind.JOIN, 1, 0, w, 2, 2, phase=call), addr)


def test_the_next_calls_join_stands_in_for_a_lost_leave():
    sw = Switch(2, 3, values=4)
    for w in range(2):
        got = join(sw, w, 10 + w, ADDRS[w])
    assert [(h.kind, h.session) for h, _, _ in got] == [(Kind.JOINED, 1)] * 2
    # a lost JOINED: the repeated JOIN (same call id) gets it again
    got = join(sw, 1, 11, ADDRS[1])
    assert [(h.kind, h.session, a) for h, _, a in got] == [(Kind.JOINED, 1, ADDRS[1])]
    assert sw.free_slots == 1
    for phase, values in ((0, (0, 0)), (1, (5, 7))):
        for w in range(2):
            got = datum(sw, w, phase, values[w], ADDRS[w])
    assert [(h.kind, v) for h, v, _ in got] == [(Kind.RESULT, [12])] * 2
    # worker 0 has its result, leaves and starts its next call; worker 1 lost its result
    assert send(sw, Header(Kind.LEAVE, 1, 1, 0, 2), ADDRS[0]) == []
    assert join(sw, 0, 20, NEW[0]) == []
    assert join(sw, 0, 20, NEW[0]) == []  # repeated: still held
    assert sw.free_slots == 1  # worker 1 still needs the old session
    again = datum(sw, 1, 1, 7, ADDRS[1])
    assert [(h.kind, h.session, v, a) for h, v, a in again] == [(Kind.RESULT, 1, [12], ADDRS[1])]
    # worker 1's LEAVE is lost; its next call's JOIN frees the old session and starts the next
    got = join(sw, 1, 21, NEW[1])
    kinds = [(h.kind, h.worker, h.session, a) for h, _, a in got]
    assert kinds == [(Kind.LEFT, 0, 1, NEW[0]), (Kind.LEFT, 1, 1, NEW[1]),
                     (Kind.JOINED, 0, 2, NEW[0]), (Kind.JOINED, 1, 2, NEW[1])]
    assert sw.free_slots == 1 and sw.stats.sessions == 2
    # a repeated JOIN of the new call (its JOINED lost) gets the new session again
    got = join(sw, 0, 20, NEW[0])
    assert [(h.kind, h.session, a) for h, _, a in got] == [(Kind.JOINED, 2, NEW[0])]
    for phase, values in ((0, (0, 0)), (1, (-4, 1))):
        for w in range(2):
            got = datum(sw, w, phase, values[w], NEW[w], session=2)
    assert [v for _, v, _ in got] == [[-3], [-3]]
    # the old session's stale LEAVE, late: answered, nothing freed
    late = send(sw, Header(Kind.LEAVE, 1, 1, 1, 2), ADDRS[1])
    assert [(h.kind, h.session) for h, _, _ in late] == [(Kind.LEFT, 1)] and sw.free_slots == 1


def test_a_new_call_before_the_session_started_replaces_the_last_join():
    sw = Switch(2, 3, values=4)
    assert send(sw, Header(Kind.JOIN, 1, 0, 0, 2, 2, 2, 4, 10), ADDRS[0],
                np.array([30, 30], ">i4").tobytes()) == []
    # worker 0 gave up before worker 1 came; its next call joins the same, unstarted session
    assert send(sw, Header(Kind.JOIN, 1, 0, 0, 2, 2, 2, 4, 11), NEW[0],
                np.array([1, 2], ">i4").tobytes()) == []
    got = send(sw, Header(Kind.JOIN, 1, 0, 1, 2, 2, 2, 4, 12), ADDRS[1],
               np.array([3, -5], ">i4").tobytes())
    assert [(h.kind, h.session, v, a) for h, v, a in got] == [
        (Kind.JOINED, 1, [3, 2], NEW[0]), (Kind.JOINED, 1, [3, 2], ADDRS[1])]


def test_joins_carrying_first_exponents_skip_phase_0():
    sw = Switch(2, 4, values=4)
    exps = [np.array([3, EMPTY, 9], ">i4"), np.array([5, -2, NONFINITE], ">i4")]
    for w in range(2):  # 2 slots granted, 3 exponents offered
        got = send(sw, Header(Kind.JOIN, 1, 0, w, 2, 2, 3, 4), ADDRS[w], exps[w].tobytes())
    assert [(h.kind, h.slot, v) for h, v, _ in got] == [(Kind.JOINED, 2, [5, -2])] * 2
    # a lost JOINED: the repeated JOIN gets the same maxima; phase 1 is taken at once
    got = send(sw, Header(Kind.JOIN, 1, 0, 0, 2, 2, 3, 4), ADDRS[0], exps[0].tobytes())
    assert [(h.kind, v, a) for h, v, a in got] == [(Kind.JOINED, [5, -2], ADDRS[0])]
    for w, value in ((0, 6), (1, -1)):
        got = datum(sw, w, 1, value, ADDRS[w])
    assert [(h.phase, h.exp, v) for h, v, _ in got] == [(1, 3, [5])] * 2
    # exponents for other values per packet, too few for the slots, or from one worker only:
    # no JOINED payload, phase 0 runs first
    for counts, values in (((2, 2), 8), ((1, 1), 4), ((2, 0), 4)):
        sw = Switch(2, 4, values=4)
        for w in range(2):
            got = send(sw, Header(Kind.JOIN, 1, 0, w, 2, 2, counts[w], values), ADDRS[w],
                       exps[w][:counts[w]].tobytes())
        assert [(h.kind, v) for h, v, _ in got] == [(Kind.JOINED, [])] * 2
        early = datum(sw, 0, 1, 6, ADDRS[0])
        assert [(h.kind, h.reason) for h, _, _ in early] == [(Kind.REJECT, Reason.BAD_PHASE)]


class _Drop(Faults):
    """Drops the datagrams ``lose(data)`` picks (and duplicates as :class:`Faults` does)."""

    def __init__(self, lose, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lose = lose

    def sendto(self, sock, data, addr) -> None:
        if self.lose(bytes(data)):
            self.dropped += 1
            return
        super().sendto(sock, data, addr)


def _kind(data):
    return unpack(data)[0].kind


def test_lost_joined_and_lost_leaves_keep_every_sum_exact():
    first_joined = []

    def lose_joined(data):  # the first JOINED to each worker
        h = unpack(data)[0]
        if h.kind is Kind.JOINED and h.worker not in first_joined:
            first_joined.append(h.worker)
            return True
        return False

    stop, addr, stats = threading.Event(), [], []
    server = threading.Thread(target=lambda: stats.append(run_switch(
        "127.0.0.1", 0, 2, 8, values=64, lease=1.0, stop=stop, ready=addr.append,
        faults=_Drop(lose_joined, duplicate=0.3, seed=5))))
    server.start()
    while not addr:
        time.sleep(0.01)
    rng = np.random.default_rng(3)
    try:
        for call in range(4):
            xs = [rng.standard_normal(1000) * 10.0 ** call for _ in range(2)]
            ws = [WorkerStats() for _ in range(2)]
            outs = on_threads(lambda r, xs=xs, ws=ws: ina_allreduce(
                xs[r], switch=addr[0], rank=r, nranks=2, job=4, slots=8, stats=ws[r],
                faults=_Drop(lambda d: _kind(d) is Kind.LEAVE, duplicate=0.3, seed=r)), 2)
            exact = xs[0] + xs[1]
            for out in outs:
                assert (np.abs(out - exact) <= error_bound(xs, 64)).all()
            assert [s.slots for s in ws] == [8, 8], call  # the last session was freed
            if call:  # 16 blocks: the JOINs carried the first exponents, no phase 0
                assert [s.results for s in ws] == [16, 16]
        # every LEAVE was lost; the last session's slots come back by the lease
        other = WorkerStats()
        on_threads(lambda r: ina_allreduce(np.ones(10), switch=addr[0], rank=r, nranks=2,
                                           job=5, slots=8, stats=other if r else None), 2)
        assert other.fell_back and other.slots == 0
        time.sleep(2.2)
        other = WorkerStats()
        on_threads(lambda r: ina_allreduce(np.ones(10), switch=addr[0], rank=r, nranks=2,
                                           job=5, slots=8, stats=other if r else None), 2)
        assert not other.fell_back and other.slots == 8
    finally:
        stop.set()
        server.join()
    assert first_joined == [0, 1] and stats[0].sessions == 6 and stats[0].rejected == 0
