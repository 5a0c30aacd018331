"""The compiled progressive filling (``sim.kernels.water_fill``) against the definition of
max-min fairness: no link over capacity, and every flow crosses a full link on which no
flow gets more (so no flow can grow without shrinking one no faster than it)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.sim.flow import RTOL
from commflow.sim.kernels import water_fill


@st.composite
def flow_sets(draw):
    """Random flows over a few links: each crosses 1-3 distinct links with fractions in
    (0, 1], as packet spraying gives them."""
    nlinks = draw(st.integers(1, 6))
    capacity = np.array(draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0, 8.0]),
                                      min_size=nlinks, max_size=nlinks)))  # fmt: skip
    nflows = draw(st.integers(1, 8))
    ptr, link, fraction = [0], [], []
    for _ in range(nflows):
        links = draw(st.lists(st.integers(0, nlinks - 1), min_size=1, max_size=3, unique=True))
        link += sorted(links)
        fraction += [draw(st.sampled_from([1.0, 0.5, 0.25])) for _ in links]
        ptr.append(len(link))
    return (np.array(ptr, dtype=np.int64), np.array(link, dtype=np.int64), np.array(fraction),
            capacity)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(flow_sets())
def test_rates_are_max_min_fair(case):
    ptr, link, fraction, capacity = case
    rate = water_fill(ptr, link, fraction, capacity, RTOL)
    owner = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    load = np.bincount(link, weights=fraction * rate[owner], minlength=len(capacity))
    assert (rate > 0).all()
    assert (load <= capacity * (1 + 1e-9)).all()
    full = load >= capacity * (1 - 1e-9)
    for f in range(len(ptr) - 1):
        mine = link[ptr[f] : ptr[f + 1]]
        bottleneck = [
            lk for lk in mine if full[lk] and rate[f] >= rate[owner[link == lk]].max() * (1 - 1e-9)
        ]
        assert bottleneck, f"flow {f} (rate {rate[f]}) has no bottleneck link"


def test_two_flows_share_a_link_and_one_takes_the_rest_of_another():
    """Flows A (links 0, 1) and B (link 0) on capacities 2 and 3: both get 1 on link 0; C on
    link 1 alone then takes the 2 that A leaves."""
    ptr = np.array([0, 2, 3, 4])
    link = np.array([0, 1, 0, 1])
    rate = water_fill(ptr, link, np.ones(4), np.array([2.0, 3.0]), RTOL)
    np.testing.assert_allclose(rate, [1.0, 1.0, 2.0])
