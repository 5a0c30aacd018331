"""Parsing and formatting of sizes, bandwidths and times."""

from __future__ import annotations

import pytest

from commflow.errors import CommflowError
from commflow.units import format_size, parse_bandwidth, parse_size, parse_time, size_range


@pytest.mark.parametrize(("text", "value"), [
    ("8", 8), ("64K", 65536), ("16M", 16 << 20), ("1G", 1 << 30), ("1g", 1 << 30),
    ("2KiB", 2048), ("1.5K", 1536), (4096, 4096),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "12Q", "-4", "1.3"])
def test_parse_size_rejects(text):
    with pytest.raises(CommflowError, match="size"):
        parse_size(text)


def test_format_size_round_trips():
    for n in (1, 8, 1000, 65536, 3 << 20, 1 << 30, 1 << 40):
        assert parse_size(format_size(n)) == n
    assert format_size(65536) == "64K"


@pytest.mark.parametrize(("text", "value"), [
    ("25", 25e9), (25, 25e9), ("25GB/s", 25e9), ("1gbit", 125e6), ("200mbit", 25e6),
    ("100Gbps", 12.5e9), ("12.5GB/s", 12.5e9),
])
def test_parse_bandwidth(text, value):
    assert parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "value"), [("100us", 1e-4), ("2ms", 2e-3), ("1.5", 1.5),
                                              ("7ns", 7e-9), (0.25, 0.25)])
def test_parse_time(text, value):
    assert parse_time(text) == pytest.approx(value)


def test_size_range_matches_nccl_tests():
    assert size_range(8, 64, 2) == [8, 16, 32, 64]
    assert size_range(8, 100, 4) == [8, 32]
    with pytest.raises(CommflowError, match="bad size range"):
        size_range(64, 8, 2)
