"""Collective conventions: buffer shapes, busbw factors and the symbolic pre/postconditions."""

from __future__ import annotations

import pytest

from commflow.collectives import (
    Collective,
    Element,
    buffer_shape,
    busbw_factor,
    chunk_bytes,
    parse_collective,
    postcondition,
    precondition,
)
from commflow.errors import CommflowError


def test_parse_collective_accepts_aliases():
    assert parse_collective("reduce_scatter") is Collective.REDUCESCATTER
    assert parse_collective("all-to-all") is Collective.ALLTOALL
    with pytest.raises(CommflowError, match="unknown collective 'allreduse'"):
        parse_collective("allreduse")


@pytest.mark.parametrize(("coll", "factor"), [
    (Collective.ALLREDUCE, 2 * 7 / 8), (Collective.ALLGATHER, 7 / 8),
    (Collective.REDUCESCATTER, 7 / 8), (Collective.ALLTOALL, 7 / 8),
    (Collective.BROADCAST, 1.0), (Collective.REDUCE, 1.0), (Collective.GATHER, 7 / 8),
    (Collective.SCATTER, 7 / 8),
])
def test_busbw_factors_are_nccl_tests(coll, factor):
    assert busbw_factor(coll, 8) == pytest.approx(factor)


def test_chunk_bytes_follow_size_conventions():
    assert chunk_bytes(Collective.ALLREDUCE, 4, 4, 1024) == 256
    assert chunk_bytes(Collective.ALLGATHER, 4, 1, 1024) == 256  # size = gathered output
    assert chunk_bytes(Collective.REDUCESCATTER, 4, 1, 1024) == 256  # size = input
    assert chunk_bytes(Collective.ALLTOALL, 4, 2, 1024) == 128  # one rank's send buffer


@pytest.mark.parametrize("coll", list(Collective))
@pytest.mark.parametrize("n", [1, 3, 4])
def test_conditions_fit_buffer_shapes(coll, n):
    cf = 2
    shape = buffer_shape(coll, n, cf)
    pre = precondition(coll, n, cf, root=0)
    post = postcondition(coll, n, cf, root=0)
    assert all(buf == "input" and i < shape.input for (_, buf, i) in pre)
    assert all(buf == "output" and i < shape.output for (_, buf, i) in post)
    # every required contribution exists somewhere in the input
    available = {(e.index, r) for e in pre.values() for r in range(n) if e.ranks >> r & 1}
    for want in post.values():
        for r in range(n):
            if want.ranks >> r & 1:
                assert (want.index, r) in available


def test_alltoall_postcondition_transposes_blocks():
    post = postcondition(Collective.ALLTOALL, 3, 1)
    pre = precondition(Collective.ALLTOALL, 3, 1)
    # rank 2's output block 0 is rank 0's input block 2
    assert post[(2, "output", 0)] == pre[(0, "input", 2)]
    assert post[(0, "output", 2)] == Element(pre[(2, "input", 0)].index, 1 << 2)


def test_reduce_postcondition_only_at_root():
    post = postcondition(Collective.REDUCE, 4, 1, root=2)
    assert set(post) == {(2, "output", 0)}
    assert post[(2, "output", 0)].ranks == 0b1111
