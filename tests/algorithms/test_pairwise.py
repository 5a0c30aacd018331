"""Pairwise-exchange alltoall: the step order and the alpha-beta closed form."""

from __future__ import annotations

from fractions import Fraction

import pytest

from commflow.algorithms import build
from commflow.ir import Op

from .alphabeta import alpha_beta_time, message_count
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2**6 * 3**3 * 5**2 * 7 * 11 * 13)


@pytest.mark.parametrize("p", range(1, 14))
def test_closed_form(p):
    program = build("alltoall", "pairwise", p)
    assert alpha_beta_time(program, ALPHA, BETA, SIZE) == (p - 1) * (ALPHA + SIZE / p * BETA)
    assert message_count(program) == p * (p - 1)


def test_step_k_sends_to_r_plus_k_and_receives_from_r_minus_k():
    p, r = 6, 4
    steps = build("alltoall", "pairwise", p).steps(r, 0)
    assert steps[0].op is Op.COPY
    sends = [s for s in steps if s.op is Op.SEND]
    recvs = [s for s in steps if s.op is Op.RECV]
    assert [s.peer for s in sends] == [(r + k) % p for k in range(1, p)]
    assert [s.src.index for s in sends] == [(r + k) % p for k in range(1, p)]
    assert [s.peer for s in recvs] == [(r - k) % p for k in range(1, p)]
    assert [s.op for s in steps[1:]] == [Op.SEND, Op.RECV] * (p - 1)


def test_odd_chunks_and_channels_compute_the_collective():
    for p in (3, 4):
        check_numerically(build("alltoall", "pairwise", p, chunks=3, channels=3))
