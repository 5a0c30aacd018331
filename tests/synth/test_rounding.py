"""Balanced rounding keeps each group's total, stays at the floor or ceiling of every quota and
beats independent per-group rounding where groups compete for a row."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.synth import apportion
from commflow.synth.rounding import balanced_round


@st.composite
def instances(draw):
    groups = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 4)) for _ in range(groups)]
    group = np.repeat(np.arange(groups), sizes)
    raw = np.array([draw(st.floats(0.01, 1.0)) for _ in group])
    weights = raw / np.bincount(group, weights=raw)[group]
    rows = draw(st.integers(1, 5))
    loads = np.array([[draw(st.floats(0.0, 1.0)) for _ in group] for _ in range(rows)])
    return loads, group, weights, draw(st.integers(1, 12))


@settings(max_examples=60, deadline=None)
@given(instances())
def test_balanced_round_keeps_group_totals_and_rounds_each_quota_down_or_up(instance):
    loads, group, weights, units = instance
    counts = balanced_round(loads, group, weights, units)
    assert np.array_equal(np.bincount(group, weights=counts), np.full(group.max() + 1, units))
    quota = weights * units
    assert np.all(counts >= np.floor(quota - 1e-9)) and np.all(counts <= np.ceil(quota + 1e-9))


def test_balanced_round_spreads_competing_groups_over_both_rows():
    # Two groups, each half on row 0 (column a) and half on row 1 (column b), one unit each:
    # rounding each group alone sends both to row 0 (ties to the earlier column).
    loads = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    group = np.array([0, 0, 1, 1])
    weights = np.full(4, 0.5)
    alone = apportion([0.5, 0.5], 1) + apportion([0.5, 0.5], 1)
    assert (loads @ np.array(alone)).tolist() == [2.0, 0.0]
    assert (loads @ balanced_round(loads, group, weights, 1)).tolist() == [1.0, 1.0]
