"""Parsing and formatting of sizes, bandwidths and times (CLI side of the unit conventions).

The API speaks bytes, seconds and bytes/second; the CLI accepts binary suffixes for sizes
(``64K`` = 65536 bytes) and prints GB/s (1e9 bytes/s) and microseconds, as nccl-tests does.
"""

from __future__ import annotations

import re

from commflow.errors import CommflowError

_SIZE_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_BW_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|b|bps|B/s|bit/s)?\s*$", re.IGNORECASE)
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s)?\s*$")
_TIME_SUFFIX = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}


def parse_size(text: str | int) -> int:
    """Parse a size such as ``8``, ``64K``, ``16M``, ``1G`` (binary multiples) into bytes.

    Raises ``CommflowError`` naming the text when it is not a size.
    """
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise CommflowError(
            f"cannot parse size {text!r}: use a number with K, M, G or T (e.g. 64K)"
        )
    value = float(m.group(1)) * _SIZE_SUFFIX[m.group(2).upper()]
    if value != int(value):
        raise CommflowError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(nbytes: float) -> str:
    """Format bytes with the largest binary suffix that divides them (``65536`` -> ``64K``)."""
    n = int(nbytes)
    for suffix in ("T", "G", "M", "K"):
        unit = _SIZE_SUFFIX[suffix]
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def parse_bandwidth(text: str | float) -> float:
    """Parse a bandwidth into bytes/s.

    ``25`` or ``25GB/s`` means 25 GB/s (GB = 1e9 bytes); ``1gbit`` or ``200mbit`` are bits/s,
    as ``tc`` writes them.
    """
    if isinstance(text, int | float):
        return float(text) * 1e9
    m = _BW_RE.match(str(text))
    if not m:
        raise CommflowError(f"cannot parse bandwidth {text!r}: use e.g. 25 (GB/s) or 1gbit")
    value = float(m.group(1))
    scale = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    unit = (m.group(3) or "").lower()
    if unit in ("bit", "bit/s", "bps"):
        return value * scale / 8
    if unit == "" and m.group(2) == "":
        return value * 1e9
    return value * scale


def parse_time(text: str | float) -> float:
    """Parse a time such as ``100us``, ``2ms``, ``1.5`` (seconds) into seconds."""
    if isinstance(text, int | float):
        return float(text)
    m = _TIME_RE.match(str(text))
    if not m:
        raise CommflowError(f"cannot parse time {text!r}: use e.g. 100us, 2ms or 1.5s")
    return float(m.group(1)) * _TIME_SUFFIX[m.group(2)]


def size_range(begin: int, end: int, factor: int) -> list[int]:
    """Sizes ``begin, begin*factor, ...`` up to ``end`` inclusive (nccl-tests ``-b -e -f``)."""
    if begin <= 0 or end < begin or factor < 2:
        raise CommflowError(
            f"bad size range -b {begin} -e {end} -f {factor}: need 0 < begin <= end, factor >= 2"
        )
    sizes = []
    size = begin
    while size <= end:
        sizes.append(size)
        size *= factor
    return sizes


GB = 1e9
"""Bytes in a GB, as nccl-tests counts bandwidth."""
