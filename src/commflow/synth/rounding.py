"""Rounding fractions to whole chunks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def apportion(weights: Sequence[float], chunks: int) -> list[int]:
    """Integer chunk counts summing to ``chunks`` proportional to ``weights`` (largest
    remainders, ties to the earlier weight)."""
    w = np.asarray(weights, dtype=np.float64)
    quota = w / w.sum() * chunks
    counts = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - counts), kind="stable")
    counts[order[: chunks - int(counts.sum())]] += 1
    return counts.tolist()
