"""Send/receive matching (:func:`commflow.ir.match_transfers`) against a FIFO reference."""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pytest

from commflow.algorithms import build
from commflow.ir import Op, Program, match_transfers

from .programs import ring_allreduce, two_channel_allgather

PROGRAMS = [
    ring_allreduce(5),
    two_channel_allgather(4),
    build("alltoall", "pairwise", 6),
    build("allreduce", "halving_doubling", 8),
    build("allreduce", "ring", 4, chunks=3, channels=2),
    build("allreduce", "direct", 4),
]


def fifo_reference(program: Program, mirror: bool) -> list[int]:
    """The k-th receive of ``dst`` from ``src`` on channel ``c`` takes the k-th send of
    ``src`` to ``dst`` on channel ``c``: one queue per connection, in plain Python."""
    t = program.table
    queues: dict[tuple[int, int, int], deque[int]] = defaultdict(deque)
    for i in np.flatnonzero(t.op == Op.SEND).tolist():
        queues[(int(t.part[i]), int(t.peer[i]), int(t.chan[i]))].append(i)
    matched = [-1] * len(t)
    for i in np.flatnonzero((t.op == Op.RECV) | (t.op == Op.RECV_REDUCE)).tolist():
        j = queues[(int(t.peer[i]), int(t.part[i]), int(t.chan[i]))].popleft()
        matched[i] = j
        if mirror:
            matched[j] = i
    assert not any(queues.values())
    return matched


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_matches_fifo_reference(program: Program, mirror: bool, dtype: type) -> None:
    matched = match_transfers(program, mirror=mirror, dtype=dtype)
    assert matched.dtype == dtype
    assert matched.tolist() == fifo_reference(program, mirror)
