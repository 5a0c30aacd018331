"""The minimum arborescence matches brute force on random small graphs."""

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.synth.trees import _edmonds


def brute_force(weights: np.ndarray) -> float:
    """Cheapest spanning out-tree rooted at 0 over every parent assignment (inf if none)."""
    n = len(weights)
    best = math.inf
    for parents in itertools.product(range(n), repeat=n - 1):
        parent = (-1, *parents)
        if any(parent[v] == v for v in range(1, n)):
            continue
        if all(_reaches_root(parent, v) for v in range(1, n)):
            best = min(best, sum(weights[parent[v], v] for v in range(1, n)))
    return best


def _reaches_root(parent: tuple[int, ...], v: int) -> bool:
    seen = set()
    while v != 0:
        if v in seen:
            return False
        seen.add(v)
        v = parent[v]
    return True


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(0, 10_000), st.floats(0.3, 1.0))
def test_cost_equals_brute_force(n, seed, density):
    rng = np.random.default_rng(seed)
    weights = np.where(rng.random((n, n)) < density, rng.integers(1, 20, (n, n)), np.inf)
    expected = brute_force(weights.astype(float))
    parent = _edmonds(weights.astype(float), 0)
    if math.isinf(expected):
        assert parent is None
        return
    assert parent is not None and parent[0] == -1
    assert all(_reaches_root(tuple(parent), v) for v in range(1, n))
    assert sum(weights[parent[v], v] for v in range(1, n)) == expected
