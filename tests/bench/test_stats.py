"""Median and its order-statistics confidence interval, against hand computation and the
binomial distribution (scipy) as an independent reference."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binom

from commflow.bench.stats import median, median_ci_ranks, summarize
from commflow.errors import CommflowError


def test_median_of_odd_and_even_counts():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([7.0]) == 7.0


def test_median_of_nothing_is_an_error():
    with pytest.raises(CommflowError, match="at least one"):
        median([])


def test_ci_ranks_by_hand():
    # n = 10: [x(2), x(9)] misses the median when 0, 1, 9 or 10 samples lie below it:
    # 1 - 2 (1 + 10) / 1024 = 0.9785 >= 0.95, while [x(3), x(8)] covers
    # 1 - 2 (1 + 10 + 45) / 1024 = 0.8906.
    assert median_ci_ranks(10) == (2, 9)
    # n = 6: [x(1), x(6)] covers 1 - 2/64 = 0.969; n = 5 only 1 - 2/32 = 0.9375.
    assert median_ci_ranks(6) == (1, 6)
    assert median_ci_ranks(5) is None
    # Le Boudec's table A.1: n = 20 -> (6, 15), n = 100 -> (40, 61).
    assert median_ci_ranks(20) == (6, 15)
    assert median_ci_ranks(100) == (40, 61)


def test_summary_by_hand():
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 9.0, 8.0, 7.0, 6.0, 10.0]
    s = summarize(samples)
    assert (s.median, s.ci, s.runs) == (5.5, (2.0, 9.0), 10)
    few = summarize([3.0, 1.0, 2.0])
    assert (few.median, few.ci, few.runs) == (2.0, None, 3)


def test_confidence_must_be_a_probability():
    with pytest.raises(CommflowError, match="strictly between 0 and 1"):
        median_ci_ranks(10, confidence=1.0)


@given(st.integers(min_value=6, max_value=400))
def test_ci_ranks_are_the_tightest_with_95_percent_coverage(n):
    j, k = median_ci_ranks(n)
    assert k == n - j + 1

    def coverage(j: int) -> float:  # P(j <= #below <= n - j)
        return binom.cdf(n - j, n, 0.5) - binom.cdf(j - 1, n, 0.5)

    assert coverage(j) >= 0.95 - 1e-12
    assert j == n // 2 or coverage(j + 1) < 0.95


@given(st.lists(st.floats(min_value=0, max_value=1e3), min_size=1, max_size=60))
def test_interval_brackets_the_median(samples):
    s = summarize(samples)
    assert s.runs == len(samples)
    assert min(samples) <= s.median <= max(samples)
    if s.ci is not None:
        assert s.ci[0] <= s.median <= s.ci[1]
