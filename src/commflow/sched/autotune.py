"""ByteScheduler's knobs, searched: the partition size and credits that minimise the
simulated iteration time.

ByteScheduler tunes them online by Bayesian optimisation; with a simulator a full grid is
cheaper and exact: :data:`PARTITIONS` x :data:`CREDITS` (42 simulations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from commflow.sched.cost import CommCost
from commflow.sched.engine import Schedule, simulate
from commflow.sched.policies import MIB, get_policy
from commflow.sched.workload import ScheduleError, Workload

PARTITIONS = tuple(int(MIB * f) for f in (0.25, 0.5, 1, 2, 4, 8, 16))
"""Partition sizes tried, bytes."""
CREDITS = (1, 2, 3, 4, 6, 8)
"""Messages in flight tried."""


def autotune(workload: Workload, cost: CommCost, *,
             partitions: Sequence[int] = PARTITIONS,
             credits: Sequence[int] = CREDITS) -> Schedule:
    """The fastest ``bytescheduler`` schedule over ``partitions`` x ``credits``; its policy
    (named ``bytescheduler-tuned``) carries the chosen values. Ties: the smaller partition,
    then fewer credits.

    Raises ``ScheduleError`` for an empty grid.
    """
    if not partitions or not credits:
        raise ScheduleError("autotune needs at least one partition size and one credit")
    base = get_policy("bytescheduler")
    best: Schedule | None = None
    for size in sorted(partitions):
        for credit in sorted(credits):
            policy = dataclasses.replace(base, name="bytescheduler-tuned",
                                         partition_bytes=float(size), credits=credit)
            schedule = simulate(workload, policy, cost)
            if best is None or schedule.iteration_time < best.iteration_time * (1 - 1e-12):
                best = schedule
    assert best is not None
    return best
