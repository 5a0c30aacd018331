"""Recursive halving and doubling (Rabenseifner): halving steps, the alpha-beta closed forms
and the fold."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from commflow.algorithms import build
from commflow.algorithms.halving_doubling import halving_steps
from commflow.ir import Op

from .alphabeta import alpha_beta_time
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2**6 * 3**3 * 5**2 * 7 * 11 * 13)


@pytest.mark.parametrize("pof2", [1, 2, 4, 8, 16])
def test_halving_keeps_shrinking_ranges_ending_at_the_rank_itself(pof2):
    for new in range(pof2):
        lo, size = 0, pof2
        for partner, sent, kept, half in halving_steps(new, pof2):
            assert half == size // 2 and partner == new ^ half
            assert {sent, kept} == {lo, lo + half} and kept <= new < kept + half
            assert partner in range(sent, sent + half)
            lo, size = kept, half
        assert (lo, size) == (new, 1)


@pytest.mark.parametrize("p", [1, 2, 4, 8, 16])
def test_reducescatter_closed_form_and_halving_messages(p):
    program = build("reducescatter", "halving_doubling", p)
    lg = int(math.log2(p))
    assert (
        alpha_beta_time(program, ALPHA, BETA, SIZE) == lg * ALPHA + Fraction(p - 1, p) * SIZE * BETA
    )
    assert [s.count for s in program.steps(0, 0) if s.op is Op.SEND] == [
        p // 2**s for s in range(1, lg + 1)
    ]


@pytest.mark.parametrize("p", range(1, 18))
def test_allreduce_closed_form_including_the_fold(p):
    pof2 = 1 << (p.bit_length() - 1)
    lg = int(math.log2(pof2))
    want = 2 * lg * ALPHA + 2 * Fraction(pof2 - 1, pof2) * SIZE * BETA
    if p != pof2:
        want += 2 * (ALPHA + SIZE * BETA)
    program = build("allreduce", "halving_doubling", p)
    assert alpha_beta_time(program, ALPHA, BETA, SIZE) == want
    assert program.chunk_factor == pof2


@pytest.mark.parametrize("p", [3, 5, 6, 7, 12])
def test_reducescatter_fold_costs_one_extra_exchange_each_way(p):
    """The even rank of a pair sends its whole input (n bytes) and gets its block back."""
    program = build("reducescatter", "halving_doubling", p)
    cf = program.chunk_factor
    assert [(s.op, s.count) for s in program.steps(0, 0)] == [(Op.SEND, p * cf), (Op.RECV, cf)]


def test_odd_chunks_and_channels_compute_the_collective():
    for coll in ("reducescatter", "allreduce"):
        for p in (6, 8):
            check_numerically(build(coll, "halving_doubling", p, chunks=3, channels=3))
