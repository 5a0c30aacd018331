"""Bruck allgather and alltoall: alpha-beta closed forms for every p, log-many messages,
per-channel scratch regions."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from commflow.algorithms import build
from commflow.ir import Op

from .alphabeta import alpha_beta_time, message_count
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2**6 * 3**3 * 5**2 * 7 * 11 * 13)


@pytest.mark.parametrize("p", range(1, 18))
def test_allgather_closed_form(p):
    program = build("allgather", "bruck", p)
    steps = math.ceil(math.log2(p)) if p > 1 else 0
    assert (
        alpha_beta_time(program, ALPHA, BETA, SIZE)
        == steps * ALPHA + Fraction(p - 1, p) * SIZE * BETA
    )
    assert message_count(program) == p * steps


@pytest.mark.parametrize("p", range(1, 18))
def test_alltoall_closed_form(p):
    program = build("alltoall", "bruck", p)
    moved = [sum(1 for i in range(p) if i >> s & 1) for s in range((p - 1).bit_length())]
    assert alpha_beta_time(program, ALPHA, BETA, SIZE) == sum(
        ALPHA + m * SIZE / p * BETA for m in moved
    )
    assert message_count(program) == p * len(moved)


def test_channels_use_disjoint_scratch_and_one_message_per_step():
    p, channels = 6, 3
    program = build("allgather", "bruck", p, channels=channels)
    assert program.participants[0].scratch_chunks == channels * p
    for c in range(channels):
        sends = [s.src for s in program.steps(2, c) if s.op is Op.SEND]
        assert [(ref.index, ref.count) for ref in sends] == [(c * p, 1), (c * p, 2), (c * p, 2)]


def test_odd_chunks_and_channels_compute_the_collective():
    for coll in ("allgather", "alltoall"):
        for p in (5, 7):
            check_numerically(build(coll, "bruck", p, chunks=3, channels=3))
