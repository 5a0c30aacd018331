"""Ranking measured runs: which algorithm was fastest at each size, and how ``auto`` compares.

``commflow bench --algo all`` times ``auto`` beside every fixed algorithm in the same run;
:func:`versus_fixed` ranks them per size (the one place that compares, as for simulated
times) and states the issue-16 goal: ``auto`` within a tolerance of the fastest fixed
algorithm at every size, and faster than every fixed algorithm over the whole sweep (the sum
of its times).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class SizeVerdict:
    """``auto`` against the fastest fixed algorithm at one size."""

    size: int
    auto: float
    """``auto``'s seconds."""
    best: str
    """The fastest fixed algorithm."""
    best_seconds: float

    @property
    def ratio(self) -> float:
        """``auto`` time over the fastest fixed algorithm's (1.0: as fast)."""
        return self.auto / self.best_seconds


@dataclass(frozen=True)
class Versus:
    """``auto`` against the fixed algorithms over a sweep."""

    sizes: tuple[SizeVerdict, ...]
    totals: Mapping[str, float]
    """Seconds summed over the sweep per algorithm, ``auto`` included."""

    def worst(self) -> SizeVerdict:
        """The size where ``auto`` is furthest behind the fastest fixed algorithm."""
        return max(self.sizes, key=lambda v: v.ratio)

    def within(self, tolerance: float) -> bool:
        """Whether ``auto`` is within ``tolerance`` (0.05: 5%) of the fastest at every size."""
        return all(v.ratio <= 1 + tolerance for v in self.sizes)

    def beats_every_fixed(self) -> bool:
        """Whether ``auto``'s total over the sweep is below every fixed algorithm's."""
        mine = self.totals[AUTO]
        return all(mine < t for name, t in self.totals.items() if name != AUTO)


def versus_fixed(times: Iterable[tuple[str, int, float]]) -> Versus:
    """``auto`` against the fixed algorithms from ``(algo, size, seconds)`` rows (one run);
    only sizes where ``auto`` and every algorithm ran are compared. Raises ``ValueError``
    when ``auto`` or a fixed algorithm is missing."""
    table: dict[int, dict[str, float]] = {}
    for algo, size, seconds in times:
        table.setdefault(int(size), {})[algo] = float(seconds)
    names = set().union(*(set(row) for row in table.values())) if table else set()
    if AUTO not in names or len(names) < 2:
        raise ValueError("versus_fixed needs auto and at least one fixed algorithm")
    complete = {s: row for s, row in sorted(table.items()) if set(row) == names}
    verdicts = []
    for size, row in complete.items():
        best = min((n for n in row if n != AUTO), key=lambda n: (row[n], n))
        verdicts.append(SizeVerdict(size, row[AUTO], best, row[best]))
    totals = {n: sum(row[n] for row in complete.values()) for n in sorted(names)}
    return Versus(tuple(verdicts), totals)
