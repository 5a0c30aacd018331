"""The switch's slot logic on the unit level: no sockets, ``Switch.handle`` only."""

import numpy as np
import pytest

from commflow.ina.protocol import EMPTY, Header, InaError, Kind, Reason, pack, unpack, unpack_peers
from commflow.ina.switch import Switch

ADDRS = [("127.0.0.1", 5000 + w) for w in range(4)]


def replies(out):
    return [(unpack(data)[0], np.frombuffer(unpack(data)[1], ">i4").tolist(), addr)
            for data, addr in out]


def join(sw, job=0, slots=2, n=2):
    out = []
    for w in range(n):
        out = sw.handle(pack(Header(Kind.JOIN, job, 0, w, n, slots)), ADDRS[w], now=0.0)
    return replies(out)


def data(sw, w, phase, values, *, job=0, session=1, slot=0, exp=EMPTY, offset=None, n=2):
    offset = phase * 10 if offset is None else offset
    h = Header(Kind.DATA, job, session, w, n, slot, len(values), exp, phase, offset, phase & 1)
    return replies(sw.handle(pack(h, np.array(values, ">i4").tobytes()), ADDRS[w], now=0.0))


def test_join_is_a_barrier_and_grants_slots():
    sw = Switch(2, 8, values=4)
    first = sw.handle(pack(Header(Kind.JOIN, 0, 0, 0, 2, 3)), ADDRS[0], now=0.0)
    assert first == [] and sw.free_slots == 5
    got = join(sw, slots=3)
    assert [(h.kind, h.worker, h.session, h.slot, h.count, a) for h, _, a in got] == [
        (Kind.JOINED, 0, 1, 3, 4, ADDRS[0]), (Kind.JOINED, 1, 1, 3, 4, ADDRS[1])]
    again = replies(sw.handle(pack(Header(Kind.JOIN, 0, 0, 1, 2, 3)), ADDRS[1], now=0.0))
    assert [(h.kind, a) for h, _, a in again] == [(Kind.JOINED, ADDRS[1])]


def test_sum_is_sent_to_every_worker_once_all_contributed():
    sw = Switch(2, 4, values=4)
    join(sw)
    assert data(sw, 0, 0, [], exp=3) == []
    got = data(sw, 1, 0, [], exp=5)
    assert [(h.kind, h.exp, h.worker, a) for h, _, a in got] == [
        (Kind.RESULT, 5, 0, ADDRS[0]), (Kind.RESULT, 5, 1, ADDRS[1])]
    assert data(sw, 0, 1, [1, 2, -3]) == []
    got = data(sw, 1, 1, [10, 20, 30])
    assert [(h.phase, h.ver, v) for h, v, _ in got] == [(1, 1, [11, 22, 27])] * 2


def test_duplicate_is_not_counted_twice():
    sw = Switch(2, 4, values=4)
    join(sw)
    data(sw, 0, 0, [])
    data(sw, 1, 0, [])
    assert data(sw, 0, 1, [1, 1]) == []
    assert data(sw, 0, 1, [1, 1]) == []
    got = data(sw, 1, 1, [5, 5])
    assert got[0][1] == [6, 6]
    assert sw.stats.duplicates == 1 and sw.stats.results == 2


def test_retransmission_of_a_completed_phase_gets_the_stored_result():
    sw = Switch(2, 4, values=4)
    join(sw)
    data(sw, 0, 0, [])
    data(sw, 1, 0, [])
    data(sw, 0, 1, [1])
    data(sw, 1, 1, [2])
    # worker 1 got phase 1 and moved on to phase 2 (copy 0); worker 0 lost the result of
    # phase 1: its retransmission reads the shadow copy 1, untouched by phase 2
    assert data(sw, 1, 2, [100]) == []
    got = data(sw, 0, 1, [1])
    assert [(h.phase, h.ver, v, a) for h, v, a in got] == [(1, 1, [3], ADDRS[0])]
    got = data(sw, 0, 2, [200])
    assert [(h.phase, v) for h, v, _ in got] == [(2, [300])] * 2


def test_stale_and_skipping_phases():
    sw = Switch(2, 4, values=4)
    join(sw)
    for p in (0, 1, 2):
        data(sw, 0, p, [p] if p else [])
        data(sw, 1, p, [p] if p else [])
    assert data(sw, 0, 0, []) == []
    assert sw.stats.stale == 1
    got = data(sw, 0, 5, [1])
    assert [(h.kind, h.reason) for h, _, _ in got] == [(Kind.REJECT, Reason.BAD_PHASE)]
    got = data(sw, 0, 3, [1], offset=999)
    assert data(sw, 1, 3, [1], offset=998)[0][0].reason is Reason.BAD_PHASE
    assert got == []


def test_protocol_violations_are_rejected_with_a_reason():
    sw = Switch(2, 4, values=4)
    join(sw, slots=2)
    assert data(sw, 0, 0, [], slot=2)[0][0].reason is Reason.BAD_SLOT
    assert data(sw, 0, 0, [], session=9)[0][0].reason is Reason.UNKNOWN_JOB
    assert data(sw, 0, 0, [], job=5)[0][0].reason is Reason.UNKNOWN_JOB
    assert data(sw, 0, 0, [1] * 5)[0][0].reason is Reason.TOO_MANY_VALUES
    assert data(sw, 0, 0, [], n=3)[0][0].reason is Reason.WRONG_NWORKERS
    assert data(sw, 3, 0, [])[0][0].reason is Reason.BAD_WORKER
    bad_kind = replies(sw.handle(pack(Header(Kind.RESULT, 0, 1, 0, 2)), ADDRS[0], now=0.0))
    assert bad_kind[0][0].reason is Reason.BAD_KIND
    assert sw.stats.rejected == 7


def test_malformed_datagrams_are_counted_and_ignored():
    sw = Switch(2, 4, values=4)
    for junk in (b"", b"hello", bytes(34), pack(Header(Kind.DATA, 0, count=3))):
        assert sw.handle(junk, ADDRS[0], now=0.0) == []
    assert sw.stats.malformed == 4
    assert "header says 3 values" in sw.stats.last_error


def test_another_protocol_version_is_answered_with_bad_version():
    sw = Switch(2, 4, values=4)
    other = bytearray(pack(Header(Kind.JOIN, 0, 0, 1, 2, 2)))
    other[4] += 1
    (notice, addr), = sw.handle(bytes(other), ADDRS[1], now=0.0)
    h, _ = unpack(notice)
    assert (h.kind, h.reason, addr) == (Kind.REJECT, Reason.BAD_VERSION, ADDRS[1])
    assert sw.stats.malformed == 1 and "protocol version 3" in sw.stats.last_error
    other_notice = bytearray(notice)
    other_notice[4] += 1
    assert sw.handle(bytes(other_notice), ADDRS[1], now=0.0) == []  # never answered


def test_noslot_when_the_pool_is_taken_and_leave_frees_it():
    sw = Switch(2, 3, values=4)
    join(sw, job=1, slots=8)
    assert sw.free_slots == 0
    refused = join(sw, job=2)
    assert {h.kind for h, _, _ in refused} == {Kind.NOSLOT}
    raw = sw.handle(pack(Header(Kind.JOIN, 2, 0, 1, 2, 1)), ADDRS[1], now=0.0)
    h, payload = unpack(raw[0][0])
    assert (h.kind, h.count, unpack_peers(payload, h.count)) == (Kind.NOSLOT, 2, ADDRS[:2])
    assert sw.stats.refused == 1
    leave = Header(Kind.LEAVE, 1, 1, 0, 2)
    assert sw.handle(pack(leave), ADDRS[0], now=0.0) == []
    got = replies(sw.handle(pack(Header(Kind.LEAVE, 1, 1, 1, 2)), ADDRS[1], now=0.0))
    assert [h.kind for h, _, _ in got] == [Kind.LEFT, Kind.LEFT] and sw.free_slots == 3
    again = replies(sw.handle(pack(leave), ADDRS[0], now=0.0))
    assert [(h.kind, h.session, a) for h, _, a in again] == [(Kind.LEFT, 1, ADDRS[0])]


def test_idle_job_expires_after_its_lease():
    sw = Switch(2, 4, values=4, lease=5.0)
    sw.handle(pack(Header(Kind.JOIN, 3, 0, 0, 2, 4)), ADDRS[0], now=0.0)
    assert sw.free_slots == 0
    assert sw.expire(now=4.0) == [] and sw.expire(now=6.0) == [3]
    assert sw.free_slots == 4


def test_sizes_are_validated():
    for kwargs, message in [({"nworkers": 65, "slots": 4}, "65 workers; use 1 to 64"),
                            ({"nworkers": 2, "slots": 0}, "slots 0 must be in"),
                            ({"nworkers": 2, "slots": 4, "values": 20000}, "values per packet"),
                            ({"nworkers": 2, "slots": 65535, "values": 16368}, "MiB; keep")]:
        with pytest.raises(InaError, match=message):
            Switch(**kwargs)
