"""What a data-parallel collective costs: ``time = alpha + bytes / bandwidth`` per message.

One :class:`CommCost` describes the allreduce of a cluster's data-parallel group; a
reduce-scatter or all-gather of the same bytes costs half of its latency and half of its
bandwidth term (the ring allreduce is one of each). A message of ``b`` bytes takes ``alpha``
seconds of latency (start-up, synchronisation, per-step latencies) and then ``b / bandwidth``
seconds on the link; latency overlaps with other messages' transfers when several are in
flight (:class:`~commflow.sched.policies.Policy.credits`), transfers do not.
"""

from __future__ import annotations

from dataclasses import dataclass

from commflow.sched.workload import ScheduleError
from commflow.topology.graph import Topology

KINDS = ("allreduce", "reducescatter", "allgather")
"""Collectives a scheduled message can be."""


@dataclass(frozen=True)
class CommCost:
    """Allreduce cost: ``alpha`` seconds plus ``bytes / bandwidth`` (bytes/s of buffer)."""

    alpha: float
    bandwidth: float
    name: str = "custom"

    def __post_init__(self) -> None:
        if self.alpha < 0 or not self.bandwidth > 0:
            raise ScheduleError(
                f"cost {self.name!r}: alpha must be >= 0 and bandwidth > 0 "
                f"(got {self.alpha}, {self.bandwidth})")

    def latency(self, kind: str) -> float:
        """Seconds of latency of one ``kind`` message."""
        return self.alpha * _share(kind)

    def transfer(self, kind: str, nbytes: float) -> float:
        """Seconds ``nbytes`` of a ``kind`` message hold the link."""
        return nbytes * _share(kind) / self.bandwidth

    def time(self, kind: str, nbytes: float) -> float:
        """Seconds of one ``kind`` message of ``nbytes`` alone on the link."""
        return self.latency(kind) + self.transfer(kind, nbytes)


def _share(kind: str) -> float:
    if kind not in KINDS:
        raise ScheduleError(f"unknown collective {kind!r}; use one of {', '.join(KINDS)}")
    return 1.0 if kind == "allreduce" else 0.5


def ring_cost(workers: int, gbit_per_s: float, step_latency: float = 25e-6) -> CommCost:
    """Ring allreduce over ``workers`` with one ``gbit_per_s`` link each way per worker:
    ``2 (n-1)`` steps of ``step_latency`` seconds and ``2 (n-1)/n`` of the buffer through
    each link.

    Raises ``ScheduleError`` for fewer than 2 workers or a non-positive rate.
    """
    if workers < 2 or not gbit_per_s > 0:
        raise ScheduleError(
            f"ring_cost needs >= 2 workers and a positive link rate (got {workers}, "
            f"{gbit_per_s} Gbit/s)")
    link = gbit_per_s * 1e9 / 8
    return CommCost(alpha=2 * (workers - 1) * step_latency,
                    bandwidth=link * workers / (2 * (workers - 1)),
                    name=f"ring of {workers} at {gbit_per_s:g} Gbit/s")


def fitted_cost(seconds_at: dict[float, float], name: str = "fitted") -> CommCost:
    """The least-squares ``alpha + bytes / bandwidth`` through ``{bytes: seconds}`` points (at
    least two sizes), e.g. simulated or measured allreduce times.

    Raises ``ScheduleError`` when the points do not give a positive bandwidth.
    """
    import numpy as np

    if len(seconds_at) < 2:
        raise ScheduleError(f"fitting a cost needs two or more sizes (got {len(seconds_at)})")
    sizes = np.array(list(seconds_at), dtype=float)
    times = np.array(list(seconds_at.values()), dtype=float)
    slope, intercept = np.polyfit(sizes, times, 1)
    if not slope > 0:
        raise ScheduleError(f"cost {name!r}: times do not grow with size; check the points")
    return CommCost(alpha=max(float(intercept), 0.0), bandwidth=1.0 / float(slope), name=name)


def topology_cost(topo: Topology, sizes: tuple[int, ...] = (1 << 20, 1 << 28)) -> CommCost:
    """The allreduce cost of ``topo``: the fastest registered algorithm at each of ``sizes``
    bytes (:func:`commflow.tune.rank`, alpha-beta simulation), fitted by :func:`fitted_cost`.
    """
    from commflow.tune import rank, registered

    candidates = registered("allreduce", topo)
    points = {float(size): rank(candidates, topo, size)[0].seconds for size in sizes}
    return fitted_cost(points, name=f"allreduce on {topo.name}")
