"""Results multicast to a job's group: one send per result reaches every worker (loopback
multicast), correct within the bound under loss and duplication both ways, recovered by
unicast retransmission from the shadow copies; a job whose workers do not all name the group
gets its results one per worker."""

import socket

import numpy as np
import pytest

from commflow.ina import InaError, ina_allreduce
from commflow.ina.protocol import group_address, group_field
from tests.ina.conftest import allreduce_threads, on_threads
from tests.ina.test_live import arrays, check


@pytest.fixture
def group():
    """A multicast group on a port free on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return ("239.255.18.1", s.getsockname()[1])


def test_every_result_is_sent_once_to_the_group(forked, group):
    n = 4
    sw = forked(n, 8)
    xs = arrays(n, 20_000, np.float32, seed=21)
    # no loss: a timeout far above any stall of a loaded host, so nothing is sent again
    outs, stats = allreduce_threads(xs, sw.addr, slots=8, group=group, min_rto=2.0)
    check(outs, xs)
    got = sw.stop()
    blocks = -(-20_000 // 256)
    assert got["results"] == got["multicast"] == blocks + 8  # one phase 0 per slot
    assert all(s.results == s.group_results == blocks + 8 for s in stats)
    assert all(s.retransmits == 0 for s in stats)


@pytest.mark.parametrize("drop, dup", [(0.01, 0.0), (0.05, 0.0), (0.05, 0.1)])
def test_multicast_under_loss_and_duplication(forked, group, drop, dup):
    n = 4
    sw = forked(n, 8, loss=drop, dup=dup)
    xs = arrays(n, 20_000, np.float32, seed=22)
    outs, stats = allreduce_threads(xs, sw.addr, drop=drop, dup=dup, slots=8, timeout=20,
                                    group=group)
    check(outs, xs)
    got = sw.stop()
    assert got["dropped"] > 0 and got["multicast"] == got["results"]
    assert sum(s.retransmits for s in stats) > 0
    # results whose multicast was lost came back one per worker, from the shadow copies
    assert all(0 < s.group_results < s.results for s in stats)
    assert got["duplicates"] > 0 and got["rejected"] == 0


def test_a_worker_without_the_group_gets_results_one_per_worker(forked, group):
    n = 3
    sw = forked(n, 4)
    xs = arrays(n, 3000, np.float64, seed=23)
    groups = [group, group, None]
    outs, stats = allreduce_threads(
        xs, sw.addr, slots=4,
        call=lambda x, rank, **kw: ina_allreduce(x, rank=rank, group=groups[rank], **kw))
    check(outs, xs)
    assert sw.stop()["multicast"] == 0
    assert all(s.group_results == 0 and s.results > 0 for s in stats)


def test_two_jobs_on_one_group(forked, group):
    sw = forked(2, 8)
    xs = {j: arrays(2, 4000, np.float32, seed=30 + j) for j in (1, 2)}
    results = on_threads(lambda j: allreduce_threads(xs[j + 1], sw.addr, job=j + 1, slots=4,
                                                     group=group), 2)
    for j, (outs, stats) in enumerate(results):
        check(outs, xs[j + 1])
        assert all(s.group_results == s.results > 0 for s in stats)
    assert sw.stop()["sessions"] == 2


def test_group_fields_and_bad_groups():
    assert group_address(group_field(("239.255.18.1", 9998))) == ("239.255.18.1", 9998)
    assert group_field(None) == 0 and group_address(0) is None
    assert group_address(group_field(("10.0.0.1", 9998))) is None  # not multicast
    with pytest.raises(InaError, match=r"rank 0/2: group 10.0.0.1:5 is not an IPv4 multicast"):
        ina_allreduce(np.ones(3), switch=("127.0.0.1", 1), rank=0, nranks=2,
                      group=("10.0.0.1", 5))
    with pytest.raises(InaError, match=r"rank 1/2: bad group \('239.1.1.1',\)"):
        ina_allreduce(np.ones(3), switch=("127.0.0.1", 1), rank=1, nranks=2,
                      group=("239.1.1.1",))


def test_the_switch_command_counts_multicast_results(switch, group):
    sw = switch("-n", "2", "--slots", "4")
    xs = arrays(2, 2000, np.float64, seed=24)
    outs, _ = allreduce_threads(xs, sw.addr, slots=4, group=group)
    check(outs, xs)
    results = -(-2000 // 256) + 4
    assert f"{results} results ({results} multicast)" in sw.stop()
