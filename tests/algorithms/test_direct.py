"""Direct (one-shot) family: one message per rank pair, all concurrent, alpha-beta closed
forms, and reductions ordered across channels."""

from __future__ import annotations

from fractions import Fraction

import pytest

from commflow.algorithms import build
from commflow.collectives import Collective
from commflow.ir import Op

from .alphabeta import alpha_beta_time, message_count
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2**6 * 3**3 * 5**2 * 7 * 11 * 13)
ALL_PAIRS = ("allreduce", "allgather", "reducescatter", "alltoall")


@pytest.mark.parametrize("p", range(2, 12))
def test_closed_forms(p):
    def time(coll: str) -> Fraction:
        return alpha_beta_time(build(coll, "direct", p, root=p - 1), ALPHA, BETA, SIZE)

    for coll in ("allreduce", "broadcast", "reduce"):
        assert time(coll) == ALPHA + SIZE * BETA
    for coll in ("allgather", "reducescatter", "alltoall", "gather", "scatter"):
        assert time(coll) == ALPHA + SIZE / p * BETA


@pytest.mark.parametrize("p", [1, 2, 5])
def test_message_counts_and_one_peer_per_channel(p):
    for coll in Collective:
        for chunks, channels in ((1, 1), (2, 3)):
            program = build(coll, "direct", p, chunks=chunks, channels=channels)
            pairs = p * (p - 1) if coll.value in ALL_PAIRS else p - 1
            assert message_count(program) == pairs * chunks * channels
            t = program.table
            for r in range(p):
                for ch in program.channels[r]:
                    peers = set(t.peer[program.step_range(r, ch)].tolist()) - {-1}
                    assert len(peers) <= 2  # sends to r+d and receives from r-d


def test_reductions_are_chained_by_dependencies():
    program = build("allreduce", "direct", 4)
    deps = [
        s.deps for ch in program.channels[0] for s in program.steps(0, ch) if s.op is Op.RECV_REDUCE
    ]
    assert deps == [(), ((0, 1),), ((1, 1),)]


def test_odd_chunks_and_channels_compute_the_collective():
    for coll in Collective:
        check_numerically(build(coll, "direct", 5, chunks=3, channels=3, root=2))
