"""Copy bandwidth probe and the copy-in/copy-out busbw bound (closed forms)."""

from __future__ import annotations

import pytest

from commflow.bench.memory import copy_bandwidth, staged_busbw_bound
from commflow.collectives import Collective
from commflow.errors import CommflowError

B = 10e9


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_allreduce_bound_is_copy_bandwidth_times_n_minus_1_over_n(n):
    # in = out = S: algbw <= B/2, busbw = 2(n-1)/n algbw
    assert staged_busbw_bound(Collective.ALLREDUCE, n, B) == pytest.approx(B * (n - 1) / n)


def test_two_rank_allreduce_bound_is_half_the_copy_bandwidth():
    assert staged_busbw_bound(Collective.ALLREDUCE, 2, B) == pytest.approx(B / 2)


@pytest.mark.parametrize("coll", [Collective.ALLGATHER, Collective.REDUCESCATTER])
def test_allgather_and_reduce_scatter_copy_one_block_and_the_array(coll):
    # S/n + S copied for size S: algbw <= B n/(n+1), busbw factor (n-1)/n
    n = 4
    assert staged_busbw_bound(coll, n, B) == pytest.approx(B * (n - 1) / (n + 1))


def test_rooted_and_alltoall_bounds():
    assert staged_busbw_bound(Collective.BROADCAST, 4, B) == pytest.approx(B / 2)
    assert staged_busbw_bound(Collective.ALLTOALL, 4, B) == pytest.approx(B / 2 * 3 / 4)


def test_copy_bandwidth_is_measured():
    bandwidth = copy_bandwidth(8 << 20, repeats=2)
    assert 1e8 < bandwidth < 1e13  # bytes/s: between 0.1 GB/s and 10 TB/s


def test_copy_bandwidth_rejects_nonsense():
    with pytest.raises(CommflowError, match="nbytes >= 1"):
        copy_bandwidth(0)
