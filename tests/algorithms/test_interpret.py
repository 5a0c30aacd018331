"""The reference interpreter itself: it accepts a hand-written correct program and catches
wrong ones."""

from __future__ import annotations

import pytest

from commflow.collectives import Collective
from commflow.ir import ProgramBuilder, inp, out

from ..ir.programs import ring_allgather, ring_allreduce
from .interpret import check_numerically


@pytest.mark.parametrize("n", [1, 2, 5])
def test_hand_written_rings_pass(n):
    check_numerically(ring_allreduce(n))
    check_numerically(ring_allgather(n))


def test_wrong_sum_and_unwritten_output_fail():
    b = ProgramBuilder(Collective.ALLREDUCE, 2, chunk_factor=1, name="wrong")
    b.send(0, 1, inp(0))
    b.recv(1, 0, out(0))  # rank 1 drops its own contribution; rank 0 never writes
    with pytest.raises(AssertionError, match="wrong rank 0"):
        check_numerically(b.build())
