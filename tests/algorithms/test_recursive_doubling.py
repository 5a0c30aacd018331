"""Recursive doubling: message sizes per step, the alpha-beta closed forms, the fold for
other rank counts, and pipelining."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from commflow.algorithms import build
from commflow.ir import Op

from .alphabeta import alpha_beta_time
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2**6 * 3**3 * 5**2 * 7 * 11 * 13)


@pytest.mark.parametrize("p", [1, 2, 4, 8, 16])
def test_allgather_closed_form_and_one_message_per_step(p):
    program = build("allgather", "recursive_doubling", p)
    lg = int(math.log2(p))
    assert (
        alpha_beta_time(program, ALPHA, BETA, SIZE) == lg * ALPHA + Fraction(p - 1, p) * SIZE * BETA
    )
    for r in range(p):
        assert [s.count for s in program.steps(r, 0) if s.op is Op.SEND] == [
            2**s for s in range(lg)
        ]


@pytest.mark.parametrize("p", range(1, 18))
def test_allreduce_closed_form_including_the_fold(p):
    pof2 = 1 << (p.bit_length() - 1)
    rounds = int(math.log2(pof2)) + (2 if p != pof2 else 0)
    program = build("allreduce", "recursive_doubling", p)
    assert alpha_beta_time(program, ALPHA, BETA, SIZE) == rounds * (ALPHA + SIZE * BETA)


@pytest.mark.parametrize("p", [3, 5, 6, 7, 11, 13])
def test_allgather_fold_receives_every_block_once(p):
    extra = p - (1 << (p.bit_length() - 1))
    program = build("allgather", "recursive_doubling", p, chunks=2)
    cf = program.chunk_factor
    for r in range(p):
        received = sum(s.count for s in program.steps(r, 0) if s.op is Op.RECV)
        sits_out = r < 2 * extra and r % 2 == 0
        assert received == (p * cf if sits_out else (p - 1) * cf)


def test_pieces_are_forwarded_before_the_next_arrives():
    steps = build("allreduce", "recursive_doubling", 4, chunks=2).steps(1, 0)
    kinds = [(s.op, s.src.index if s.op is Op.SEND else s.dst.index) for s in steps]
    # step 0: send both pieces, then each received piece is forwarded at once in step 1
    assert kinds[:6] == [
        (Op.SEND, 0),
        (Op.SEND, 1),
        (Op.RECV_REDUCE, 0),
        (Op.SEND, 0),
        (Op.RECV_REDUCE, 1),
        (Op.SEND, 1),
    ]


def test_odd_chunks_and_channels_compute_the_collective():
    for coll in ("allgather", "allreduce"):
        for p in (5, 8):
            check_numerically(build(coll, "recursive_doubling", p, chunks=3, channels=3))
