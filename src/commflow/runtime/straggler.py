"""Stragglers: a rank that spends k times the median time outside collectives.

In a data-parallel job every rank computes the same amount between two collectives, so its
time outside commflow (from the end of one collective to the call of the next) is about the
same on every rank; a rank with a slow data loader, a throttled CPU or a noisy neighbour
spends longer, and every other rank waits for it inside the next collective. Over a window
of ``window`` collectives each rank sums that time; a rank whose sum exceeds ``factor`` times
the median of the ranks' sums, and the median by at least ``min_seconds``, is a straggler.

Two places apply the rule:

- while the job runs, over the ranks of each host: at the end of every window, each rank of
  the world communicator posts its sum to its line of the host's shared memory
  (:class:`StragglerBoard`) and compares the previous window's sums (every rank has posted
  them by then); findings go into the flight record (``stragglers``) and local rank 0 logs a
  warning (logger ``commflow.runtime.straggler``);
- afterwards, over every rank of every host: ``commflow doctor`` applies it to the flight
  records (:func:`find_in_records`).

Settings (:meth:`StragglerConfig.from_env`): ``COMMFLOW_STRAGGLER_FACTOR`` (k, default 3; 0
turns detection off), ``COMMFLOW_STRAGGLER_WINDOW`` (collectives per window, default 100, below
the flight recorder's capacity) and ``COMMFLOW_STRAGGLER_MIN`` (seconds, default 0.05).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from commflow.errors import CommflowError

LOG = logging.getLogger("commflow.runtime.straggler")
KEEP = 32
"""Findings a flight recorder keeps (the latest)."""


@dataclass(frozen=True, kw_only=True)
class StragglerConfig:
    """When a rank counts as a straggler."""

    factor: float = 3.0
    """k: a rank's time outside collectives must exceed k times the median; 0 turns it off."""
    window: int = 100
    """Collectives per window."""
    min_seconds: float = 0.05
    """The excess over the median must also be at least this many seconds per window (short
    windows of fast collectives differ by noise)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and (self.factor == 0 or self.factor >= 1)):
            raise CommflowError(f"straggler factor must be 0 (off) or a number >= 1, got "
                                f"{self.factor!r} (COMMFLOW_STRAGGLER_FACTOR)")
        if not isinstance(self.window, int) or self.window < 1:
            raise CommflowError(f"straggler window must be >= 1 collectives, got "
                                f"{self.window!r} (COMMFLOW_STRAGGLER_WINDOW)")
        if not (math.isfinite(self.min_seconds) and self.min_seconds >= 0):
            raise CommflowError(f"straggler minimum must be >= 0 seconds, got "
                                f"{self.min_seconds!r} (COMMFLOW_STRAGGLER_MIN)")

    @property
    def enabled(self) -> bool:
        """Whether detection is on."""
        return self.factor > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StragglerConfig:
        """``COMMFLOW_STRAGGLER_FACTOR``, ``COMMFLOW_STRAGGLER_WINDOW`` and
        ``COMMFLOW_STRAGGLER_MIN`` from ``env`` (defaults for those unset). Raises
        ``CommflowError`` on a value that is not a number."""
        values = {}
        for field, key, kind in (("factor", "COMMFLOW_STRAGGLER_FACTOR", float),
                                 ("window", "COMMFLOW_STRAGGLER_WINDOW", int),
                                 ("min_seconds", "COMMFLOW_STRAGGLER_MIN", float)):
            if key in env:
                try:
                    values[field] = kind(env[key])
                except ValueError:
                    raise CommflowError(f"{key}={env[key]!r}: expected a number") from None
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """A rank that spent too long outside the collectives of one window."""

    rank: int
    """Global rank."""
    first_seq: int
    """First collective of the window."""
    last_seq: int
    """Last collective of the window."""
    seconds: float
    """The rank's time outside collectives over the window."""
    median: float
    """The median of the compared ranks' times."""

    def describe(self) -> str:
        """``"rank 2 spent 0.62 s outside collectives #4-#7, 95x the median 0.0065 s"``."""
        times = self.seconds / self.median if self.median > 0 else math.inf
        return (f"rank {self.rank} spent {self.seconds:.3g} s outside collectives "
                f"#{self.first_seq}-#{self.last_seq}, {times:.1f}x the median "
                f"{self.median:.3g} s")

    def as_json(self) -> dict:
        """The finding as JSON fields."""
        return {"rank": self.rank, "first_seq": self.first_seq, "last_seq": self.last_seq,
                "seconds": round(self.seconds, 6), "median": round(self.median, 6)}


def outside_time(calls: Mapping[int, tuple[float, float | None]], first: int, last: int
                 ) -> float:
    """Seconds spent outside collectives ``first..last``: for each, from the end of the one
    before to its call, when both are known. ``calls`` maps a sequence number to
    ``(called, ended)`` times."""
    seqs = sorted(calls)
    times = np.array([calls[s] for s in seqs], float).reshape(-1, 2)  # None -> nan
    return outside_seconds(np.array(seqs, np.int64), times[:, 0], times[:, 1], first, last)


def outside_seconds(seqs: np.ndarray, called: np.ndarray, ended: np.ndarray, first: int,
                    last: int) -> float:
    """:func:`outside_time` of collectives given as arrays sorted by sequence number (``ended``
    nan where unknown)."""
    follows = (seqs[1:] == seqs[:-1] + 1) & (seqs[1:] >= first) & (seqs[1:] <= last) \
        & ~np.isnan(ended[:-1])
    return float(np.maximum(called[1:] - ended[:-1], 0.0)[follows].sum())


def find(outside: Mapping[int, float], first: int, last: int, config: StragglerConfig
         ) -> list[Straggler]:
    """The stragglers among ranks whose time outside collectives ``first..last`` is
    ``outside[rank]`` (at least 2 ranks compared, else none)."""
    if len(outside) < 2:
        return []
    median = statistics.median(outside.values())
    return [Straggler(rank=rank, first_seq=first, last_seq=last, seconds=t, median=median)
            for rank, t in sorted(outside.items())
            if t > config.factor * median and t - median >= config.min_seconds]


def find_in_records(calls_by_rank: Mapping[int, Mapping[int, tuple[float, float | None]]],
                    config: StragglerConfig) -> list[Straggler]:
    """Stragglers in every full window that all ranks recorded; ``calls_by_rank[rank]`` maps
    each collective's sequence number to its ``(called, ended)`` times."""
    if not config.enabled or len(calls_by_rank) < 2:
        return []
    last = min(max(calls, default=-1) for calls in calls_by_rank.values())
    found = []
    for window in range((last + 1) // config.window):
        first = window * config.window
        hi = first + config.window - 1
        if not all(first in calls for calls in calls_by_rank.values()):
            continue
        outside = {rank: outside_time(calls, first, hi) for rank, calls in calls_by_rank.items()}
        found.extend(find(outside, first, hi, config))
    return found


class StragglerBoard:
    """This rank's view of the host's straggler lines: per local rank ``[global rank, window
    (even), seconds (even), window (odd), seconds (odd), 1 once the rank takes part]`` as
    float64 (a rank whose recorder is off never marks its line: nothing is compared then)."""

    def __init__(self, lines: list[np.ndarray], me: int, global_rank: int,
                 config: StragglerConfig) -> None:
        self.lines = lines
        self.me = me
        self.config = config
        lines[me][0] = global_rank
        lines[me][1] = lines[me][3] = -1.0
        lines[me][5] = 1.0

    def post(self, window: int, seconds: float) -> None:
        """Publish this rank's time outside the collectives of ``window``."""
        line = self.lines[self.me]
        slot = 1 + 2 * (window % 2)
        line[slot + 1] = seconds
        line[slot] = window  # last: a reader that sees the window sees its seconds

    def compare(self, window: int) -> list[Straggler]:
        """The stragglers of ``window`` among this host's ranks (none until all posted it)."""
        slot = 1 + 2 * (window % 2)
        outside = {}
        for line in self.lines:
            if line[5] != 1.0 or line[slot] != window:
                return []
            outside[int(line[0])] = float(line[slot + 1])
        first = window * self.config.window
        return find(outside, first, first + self.config.window - 1, self.config)

    def close_window(self, window: int, calls: tuple[np.ndarray, np.ndarray, np.ndarray],
                     found: list[dict]) -> None:
        """At the end of ``window`` (``calls``: this rank's recent collectives, as
        :func:`outside_seconds` takes them): post its time, compare the window before, keep
        the findings in ``found`` (the flight record's list, at most :data:`KEEP`) and log
        them from local rank 0."""
        first = window * self.config.window
        self.post(window, outside_seconds(*calls, first, first + self.config.window - 1))
        if window == 0:
            return
        for straggler in self.compare(window - 1):
            found.append(straggler.as_json())
            if self.me == 0:
                LOG.warning("straggler: %s on this host (COMMFLOW_STRAGGLER_FACTOR=%g)",
                            straggler.describe(), self.config.factor)
        del found[:-KEEP]


def calls_of(entries: Iterable) -> dict[int, tuple[float, float | None]]:
    """``{seq: (t_start, t_end)}`` of the collectives among flight-record entries (objects
    with ``kind``, ``seq``, ``t_start``, ``t_end``) that started."""
    return {e.seq: (e.t_start, e.t_end) for e in entries
            if e.kind == "collective" and e.t_start is not None}
