"""Summaries of timed iterations: the median and a nonparametric 95% confidence interval.

Following Hoefler & Belli (SC'15, "Scientific benchmarking of parallel computing systems"),
timings are not assumed normal: the interval for the median comes from order statistics. With
``n`` sorted samples ``x(1) <= ... <= x(n)``, the number of samples below the true median is
Binomial(n, 1/2), so ``[x(j), x(n-j+1)]`` covers the median with probability
``sum_{i=j}^{n-j} C(n, i) / 2^n``; we take the largest ``j`` whose coverage is still at least
95% (Le Boudec, "Performance Evaluation of Computer and Communication Systems", table A.1).
Fewer than 6 samples cannot give 95% coverage: the interval is then ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from commflow.errors import CommflowError

CONFIDENCE = 0.95
"""Coverage of the reported interval."""


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The median of a set of timings and its confidence interval, in seconds."""

    median: float
    """Median of the samples (mean of the two middle ones for an even count), seconds."""
    ci: tuple[float, float] | None
    """95% confidence interval of the median (seconds), ``None`` with fewer than 6 samples."""
    runs: int
    """Number of samples."""


def median(samples: Sequence[float]) -> float:
    """The median of ``samples``; raises ``CommflowError`` when there are none."""
    if not samples:
        raise CommflowError("median of no samples: run at least one timed iteration")
    ordered = sorted(samples)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks ``(j, n-j+1)`` of the order statistics bounding the median's interval.

    ``None`` when even ``[x(1), x(n)]`` covers less than ``confidence``. Raises
    ``CommflowError`` unless ``0 < confidence < 1``.
    """
    if not 0 < confidence < 1:
        raise CommflowError(f"confidence {confidence} must lie strictly between 0 and 1")
    best = None
    tail = 0  # sum of C(n, i) for i < j: outcomes with fewer than j samples below the median
    for j in range(1, n // 2 + 1):
        tail += math.comb(n, j - 1)
        if 1 - 2 * tail / 2**n < confidence:
            break
        best = (j, n - j + 1)
    return best


def summarize(samples: Sequence[float]) -> Summary:
    """Median, 95% interval of the median and count of ``samples`` (seconds)."""
    ordered = sorted(samples)
    ranks = median_ci_ranks(len(ordered))
    ci = None if ranks is None else (ordered[ranks[0] - 1], ordered[ranks[1] - 1])
    return Summary(median=median(ordered), ci=ci, runs=len(ordered))
