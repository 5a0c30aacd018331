"""Incremental max-flows of synth.flow_kernels against scipy's max-flow from scratch."""

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import maximum_flow

from commflow.synth.flow_kernels import repair, split

NONE = np.zeros((0, 2), dtype=np.int64)


def _max_flow(cap: np.ndarray, s: int, t: int) -> int:
    return int(maximum_flow(sp.csr_array(cap.astype(np.int32)), s, t).flow_value)


def _assert_flow(cap: np.ndarray, f: np.ndarray, s: int, t: int, value: int) -> None:
    assert (f >= 0).all() and (f <= cap).all()
    balance = f.sum(axis=0) - f.sum(axis=1)  # in minus out
    expected = np.zeros(len(cap), dtype=np.int64)
    expected[t], expected[s] = value, -value
    assert np.array_equal(balance, expected)


@st.composite
def networks(draw):
    n = draw(st.integers(3, 10))
    cap = np.array(draw(st.lists(st.integers(0, 4), min_size=n * n, max_size=n * n)))
    cap = cap.reshape(n, n).astype(np.int64)
    np.fill_diagonal(cap, 0)
    arcs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(-3, 3))
    return cap, draw(st.lists(arcs, max_size=20))


def _start(cap: np.ndarray):
    """Flows from node 0 to every other node at the largest value all of them reach."""
    n = len(cap)
    sinks = np.arange(1, n, dtype=np.int64)
    need = min(_max_flow(cap, 0, t) for t in sinks)
    flows = np.zeros((n - 1, n, n), dtype=np.int64)
    values = np.zeros(n - 1, dtype=np.int64)
    assert repair(cap, flows, values, sinks, 0, NONE, need) == need
    return sinks, flows, values, need


@settings(max_examples=400, deadline=None)
@given(networks())
def test_repair_keeps_every_flow_at_need_or_reports_a_starved_sink(case):
    cap, changes = case
    sinks, flows, values, need = _start(cap)
    for a, b, delta in changes:
        if a == b:
            continue
        old = cap[a, b]
        cap[a, b] = max(0, old + delta)
        low = repair(cap, flows, values, sinks, 0, np.array([[a, b]]), need)
        fresh = [min(need, _max_flow(cap, 0, int(t))) for t in sinks]
        assert (low >= need) == (min(fresh) >= need)
        if low < need:
            assert low == fresh[int(np.argmin(values))]
            cap[a, b] = old  # callers undo a change that starves a sink
            assert repair(cap, flows, values, sinks, 0, np.array([[a, b]]), need) == need
        for i, t in enumerate(sinks):
            _assert_flow(cap, flows[i], 0, int(t), int(values[i]))
            assert values[i] == need


@settings(max_examples=400, deadline=None)
@given(networks(), st.data())
def test_split_moves_capacity_and_flow_to_the_shortcut(case, data):
    cap, _ = case
    n = len(cap)
    u, w, t = data.draw(st.permutations(range(n)))[:3]
    if w == 0:  # the source is never split off
        return
    sinks, flows, values, need = _start(cap)
    gamma = data.draw(st.integers(0, int(min(cap[u, w], cap[w, t]))))
    before = cap.copy()
    low = split(cap, flows, values, sinks, 0, u, w, t, gamma, need)
    assert cap[u, w] == before[u, w] - gamma and cap[w, t] == before[w, t] - gamma
    assert cap[u, t] == before[u, t] + gamma
    fresh = [min(need, _max_flow(cap, 0, int(s))) for s in sinks]
    assert (low >= need) == (min(fresh) >= need)
    low = split(cap, flows, values, sinks, 0, u, w, t, -gamma, need)  # undo
    assert np.array_equal(cap, before) and low == need
    for i, s in enumerate(sinks):
        _assert_flow(cap, flows[i], 0, int(s), need)


def test_cancelling_an_arc_on_a_flow_cycle_keeps_the_value():
    # Two paths s -> p -> b -> z -> t and s -> w1 -> w2 -> w3 -> c -> t, and a cycle
    # a -> b -> c -> a. The shortest flow path back from a to s (s, p, b, c, a) and the one
    # on from b to t (b, c, t) share b -> c; removing the arc a -> b must cancel the cycle.
    s, t, a, b, c, p, z, w1, w2, w3 = range(10)
    arcs = [(s, p), (p, b), (b, z), (z, t), (s, w1), (w1, w2), (w2, w3), (w3, c), (c, t)]
    arcs += [(a, b), (b, c), (c, a)]
    flow = np.zeros((1, 10, 10), dtype=np.int64)
    for x, y in arcs:
        flow[0, x, y] = 1
    cap = flow[0].copy()
    cap[a, b] = 0
    values = np.array([2])
    assert repair(cap, flow, values, np.array([t]), s, np.array([[a, b]]), 1) == 1
    _assert_flow(cap, flow[0], s, t, 2)  # no augmenting path was needed to make up a loss
    assert values[0] == 2
