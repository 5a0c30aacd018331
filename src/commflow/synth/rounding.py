"""Rounding fractions to whole chunks."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


def apportion(weights: Sequence[float], chunks: int) -> list[int]:
    """Integer chunk counts summing to ``chunks`` proportional to ``weights`` (largest
    remainders, ties to the earlier weight)."""
    w = np.asarray(weights, dtype=np.float64)
    quota = w / w.sum() * chunks
    counts = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - counts), kind="stable")
    counts[order[: chunks - int(counts.sum())]] += 1
    return counts.tolist()


def balanced_round(
    loads: np.ndarray, group: np.ndarray, weights: np.ndarray, units: int, *, passes: int = 3
) -> np.ndarray:
    """Integer counts, ``units`` per group, near ``weights * units`` (each the floor or the
    ceiling of it), chosen so the busiest row of ``loads @ counts`` stays low.

    ``loads`` is rows x columns, ``group[j]`` the group of column ``j``; the weights of each
    group sum to 1. Groups are rounded one after another, each taking the floor/ceiling
    choice that least raises the busiest row (ties: the sum of squares) given the others,
    then revisited ``passes - 1`` more times with the others fixed.
    """
    quota = np.asarray(weights, dtype=np.float64) * units
    counts = np.floor(quota + 1e-9)
    level = loads @ counts
    members = [np.flatnonzero(group == g) for g in range(int(group.max()) + 1)]
    choices = [_ceilings(quota[m] - counts[m], units - int(counts[m].sum())) for m in members]
    extra = [np.zeros(len(m)) for m in members]
    for _ in range(passes):
        for m, options, chosen in zip(members, choices, extra, strict=True):
            level -= loads[:, m] @ chosen
            after = level[:, None] + loads[:, m] @ options.T
            key = after.max(axis=0) + 1e-12 * (after**2).sum(axis=0) / max(after.max(), 1e-300)
            chosen[:] = options[int(key.argmin())]
            level += loads[:, m] @ chosen
    for m, chosen in zip(members, extra, strict=True):
        counts[m] += chosen
    return counts


_MOST_OPTIONS = 256
"""Most floor/ceiling choices :func:`balanced_round` weighs for one group."""


def _ceilings(fraction: np.ndarray, k: int) -> np.ndarray:
    """0/1 rows choosing ``k`` of the columns with ``fraction > 0`` to round up: every choice,
    or (beyond :data:`_MOST_OPTIONS`) the ``k`` largest fractions plus single swaps."""
    open_ = np.flatnonzero(fraction > 1e-9)
    if k <= 0 or not len(open_):
        return np.zeros((1, len(fraction)))
    k = min(k, len(open_))
    if math.comb(len(open_), k) <= _MOST_OPTIONS:
        picks = list(itertools.combinations(open_.tolist(), k))
    else:
        top = open_[np.argsort(-fraction[open_], kind="stable")]
        first = top[:k].tolist()
        picks = [tuple(first)] + [
            tuple(first[:i] + [j] + first[i + 1 :]) for i in range(k) for j in top[k:].tolist()
        ][: _MOST_OPTIONS - 1]
    rows = np.zeros((len(picks), len(fraction)))
    for i, pick in enumerate(picks):
        rows[i, list(pick)] = 1.0
    return rows


def whole_counts(
    loads: np.ndarray,
    group: np.ndarray,
    weights: np.ndarray,
    *,
    units: Sequence[int] = range(1, 25),
    slack: float = 0.005,
    nodes: int = 10,
    time_limit: float = 2.0,
    budget: float = 10.0,
) -> tuple[np.ndarray, int]:
    """Integer counts of the columns of ``loads`` (rows x columns, relative to the optimum:
    ``loads @ weights`` peaks at 1), ``units`` per ``group``, and ``units``.

    For each of ``units`` in turn, the first of these within ``slack`` (relative) of the
    optimum wins: ``weights`` rounded group by group (:func:`balanced_round`), else (until
    ``budget`` seconds have passed) integer counts of every column found by a MILP (scipy
    HiGHS, at most ``nodes`` branch-and-bound nodes, which keeps the result independent of
    machine load, and ``time_limit`` seconds). Else the fastest rounding.
    """
    deadline = time.perf_counter() + budget
    target = 1 + slack
    tried = []
    for total in units:
        counts = balanced_round(loads, group, weights, total)
        tried.append((float((loads @ counts).max()) / total, total, counts))
        left = deadline - time.perf_counter()
        if tried[-1][0] > target and left > 0:
            exact = _integer_counts(loads, group, total, target, nodes, min(time_limit, left))
            counts = tried[-1][2] if exact is None else exact
        if float((loads @ counts).max()) / total <= target:
            return counts, total
    _, total, counts = min(tried, key=lambda x: x[:2])
    return counts, total


def _integer_counts(loads, group, units, target, nodes, time_limit) -> np.ndarray | None:
    """Integer counts of the columns of ``loads``, ``units`` per ``group``, with every row of
    ``loads @ counts`` at most ``target * units``; ``None`` when HiGHS finds none within
    ``nodes`` nodes and ``time_limit`` seconds."""
    ncol = loads.shape[1]
    a_eq = np.zeros((int(group.max()) + 1, ncol))
    a_eq[group, np.arange(ncol)] = 1.0
    res = milp(
        np.zeros(ncol),
        constraints=[
            LinearConstraint(loads, -np.inf, target * units),
            LinearConstraint(a_eq, units, units),
        ],
        integrality=np.ones(ncol),
        bounds=Bounds(0, units),
        options={"node_limit": nodes, "time_limit": time_limit},
    )
    return None if res.x is None else np.round(res.x)
