"""Hierarchical allreduce: closed form, traffic across boxes, the ring-phase helper, box
validation."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from commflow.algorithms import build
from commflow.algorithms.hierarchical import default_group_size, ring_actions
from commflow.errors import AlgorithmError
from commflow.ir import Buffer, Op

from .alphabeta import alpha_beta_time, message_count
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2 * 3 * 5 * 7 * 11 * 13 * 16)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def closed_form(p: int, box: int) -> Fraction:
    """2(b-1)(alpha + n/b beta) + 2(g-1)(alpha + n/p beta) (Jia et al. 2018)."""
    g = p // box
    return 2 * (box - 1) * (ALPHA + SIZE / box * BETA) + 2 * (g - 1) * (ALPHA + SIZE / p * BETA)


@pytest.mark.parametrize("p", [1, 2, 4, 6, 9, 12, 16])
def test_alpha_beta_time_is_the_closed_form(p):
    for box in _divisors(p):
        program = build("allreduce", "hierarchical", p, box=box)
        assert alpha_beta_time(program, ALPHA, BETA, SIZE) == closed_form(p, box)


@pytest.mark.parametrize("p", [5, 8, 12])
def test_flat_ring_when_box_is_one_or_everyone(p):
    """Both degenerate boxes give a ring allreduce: 2(p-1)(alpha + n/p beta)."""
    ring = 2 * (p - 1) * (ALPHA + SIZE / p * BETA)
    for box in (1, p):
        program = build("allreduce", "hierarchical", p, box=box, chunks=2, channels=2)
        assert message_count(program) == p * 2 * (p - 1) * 2 * 2
        assert (
            alpha_beta_time(build("allreduce", "hierarchical", p, box=box), ALPHA, BETA, SIZE)
            == ring
        )


@pytest.mark.parametrize(("p", "box"), [(8, 2), (12, 3), (12, 4), (16, 4)])
def test_only_the_shard_allreduce_crosses_boxes(p, box):
    chunks, channels = 2, 2
    program = build("allreduce", "hierarchical", p, box=box, chunks=chunks, channels=channels)
    t = program.table
    sends = t.op == Op.SEND
    across = sends & (t.part // box != t.peer // box)
    per_rank = np.bincount(t.part[across], weights=t.count[across], minlength=p)
    g = p // box
    # 2(g-1)/p of the data, in chunks (cf = p * chunks * channels)
    np.testing.assert_array_equal(per_rank, 2 * (g - 1) * chunks * channels)
    inside = sends & ~across
    assert np.all(t.part[inside] // box == t.peer[inside] // box)


@given(st.integers(1, 500))
def test_default_box_is_the_largest_divisor_up_to_the_square_root(n):
    box = default_group_size(n)
    assert n % box == 0 and box * box <= n
    assert all(n % d for d in range(box + 1, math.isqrt(n) + 1))


def test_default_box_examples_and_params():
    assert [default_group_size(n) for n in (1, 2, 12, 16, 17, 18, 36)] == [1, 1, 3, 4, 1, 3, 6]
    program = build("allreduce", "hierarchical", 12)
    assert dict(program.params) == {"box": 3, "chunks": 1, "channels": 1}


@pytest.mark.parametrize("box", [5, 0, -2, 2.0, "3", True, 24])
def test_bad_box_is_rejected_with_the_divisors(box):
    with pytest.raises(
        AlgorithmError, match=r"box=.* does not divide nranks=12.*1, 2, 3, 4, 6, 12"
    ):
        build("allreduce", "hierarchical", 12, box=box)


def test_unknown_parameter_and_collective():
    with pytest.raises(AlgorithmError, match="unknown parameter"):
        build("allreduce", "hierarchical", 4, rows=2)
    with pytest.raises(AlgorithmError, match="no algorithm 'hierarchical' for allgather"):
        build("allgather", "hierarchical", 4)


def test_ring_actions_pipeline_and_read_the_given_source():
    """Member 1 of a 3-ring, blocks of 2 chunks at chunk 6, 2 pieces per block."""
    acts = ring_actions(
        [4, 7, 9],
        1,
        start=6,
        size=2,
        pieces=2,
        reduce_scatter=True,
        allgather=True,
        src=Buffer.INPUT,
    )
    sends = [(a.peer, a.src.buffer, a.src.index) for a in acts if a.op is Op.SEND]
    recvs = [(a.peer, a.op, a.dst.index) for a in acts if a.op is not Op.SEND]
    # reduce-scatter sends block 0 from the input, then block 2; allgather blocks 1 and 0
    assert sends == [
        (9, Buffer.INPUT, 6),
        (9, Buffer.INPUT, 7),
        (9, Buffer.OUTPUT, 10),
        (9, Buffer.OUTPUT, 11),
        (9, Buffer.OUTPUT, 8),
        (9, Buffer.OUTPUT, 9),
        (9, Buffer.OUTPUT, 6),
        (9, Buffer.OUTPUT, 7),
    ]
    assert recvs == [
        (4, Op.RECV_REDUCE, 10),
        (4, Op.RECV_REDUCE, 11),
        (4, Op.RECV_REDUCE, 8),
        (4, Op.RECV_REDUCE, 9),
        (4, Op.RECV, 6),
        (4, Op.RECV, 7),
        (4, Op.RECV, 10),
        (4, Op.RECV, 11),
    ]
    assert all(a.src.buffer is Buffer.INPUT for a in acts if a.op is Op.RECV_REDUCE)
    assert (
        ring_actions([3], 0, start=0, size=1, pieces=1, reduce_scatter=True, allgather=True) == []
    )


@pytest.mark.parametrize(("p", "box"), [(1, 1), (6, 2), (6, 3), (7, 1), (12, 4)])
def test_numeric(p, box):
    program = build("allreduce", "hierarchical", p, box=box, chunks=2, channels=2)
    assert set(program.table.chan.tolist()) == {0, 1}
    check_numerically(program)
    check_numerically(build("allreduce", "hierarchical", p, box=box), seed=1)
