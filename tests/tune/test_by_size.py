"""Program sets by size: contiguous ranges, never slower than the registered algorithms at
any tuned size, and MSCCL files each runtime's rules accept."""

from __future__ import annotations

import pytest

from commflow.algorithms import available, build_for
from commflow.errors import CommflowError
from commflow.sim import simulate
from commflow.topology import load
from commflow.tune import program_set
from commflow.tune.by_size import LARGEST
from commflow.units import size_range

SIZES = size_range(1024, 4 << 30, 16)


def test_ranges_cover_every_size_and_beat_the_registered_algorithms():
    topo = load("dgx1")
    ranges = program_set("allgather", topo, SIZES)
    assert ranges[0].min_bytes == 0 and ranges[-1].max_bytes == LARGEST
    for a, b in zip(ranges, ranges[1:], strict=False):
        assert b.min_bytes == a.max_bytes + 1
    registered = [build_for("allgather", a.name, topo) for a in available("allgather")]
    for size in SIZES:
        chosen = next(r for r in ranges if r.min_bytes <= size <= r.max_bytes)
        mine = simulate(chosen.program, topo, size).time
        assert all(mine <= simulate(p, topo, size).time * (1 + 1e-12) for p in registered)
    assert {r.method for r in ranges} >= {"direct", "bandwidth"}
    with pytest.raises(CommflowError, match="increasing sizes"):
        program_set("allgather", topo, [4096, 1024])

