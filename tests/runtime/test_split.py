"""Sub-communicators from split(color, key) run collectives among their members only."""

from __future__ import annotations

import numpy as np

from .harness import run_world


def _split_even_odd(comm):
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    x = np.array([comm.rank], dtype=np.int64)
    summed = sub.allreduce(x, algo="ring")
    gathered = sub.allgather(x, algo="ring")
    world = comm.allreduce(x)
    none = comm.split(None if comm.rank == 0 else 1)
    return sub.rank, sub.size, int(summed[0]), gathered.tolist(), int(world[0]), none is None


def test_split_groups_by_color_and_orders_by_key():
    results = run_world(_split_even_odd, 5)
    for rank, (sub_rank, size, summed, gathered, world, none) in enumerate(results):
        members = [r for r in range(5) if r % 2 == rank % 2]
        assert size == len(members)
        assert summed == sum(members)
        assert gathered == sorted(members, reverse=True)  # key = -rank
        assert sub_rank == sorted(members, reverse=True).index(rank)
        assert world == sum(range(5))
        assert none == (rank == 0)
