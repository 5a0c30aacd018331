"""The minimum arborescence matches networkx's Edmonds on random dense graphs."""

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.synth.trees import _edmonds


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(0, 10_000), st.floats(0.3, 1.0))
def test_cost_equals_networkx_minimum_arborescence(n, seed, density):
    rng = np.random.default_rng(seed)
    weights = np.where(rng.random((n, n)) < density, rng.integers(1, 20, (n, n)), np.inf)
    weights = weights.astype(float)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    for u, v in zip(*np.nonzero(np.isfinite(weights)), strict=True):
        if u != v and v != 0:
            graph.add_edge(int(u), int(v), weight=float(weights[u, v]))
    parent = _edmonds(weights, 0)
    try:
        expected = nx.minimum_spanning_arborescence(graph).size(weight="weight")
    except nx.NetworkXException:
        assert parent is None
        return
    assert parent is not None and parent[0] == -1
    assert sum(weights[parent[v], v] for v in range(1, n)) == expected
    for v in range(1, n):  # every node reaches the root by parent pointers
        seen, u = set(), v
        while u != 0:
            assert u not in seen
            seen.add(u)
            u = parent[u]
