"""The connection numbering behind :class:`commflow.sim.paths.Connections`, against numpy's
sort-based ``unique`` (including several blocks of senders)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.sim.paths import _BLOCK_CELLS, _number_pairs


@settings(max_examples=30, deadline=None)
@given(
    nparts=st.sampled_from([1, 2, 7, 1000, _BLOCK_CELLS // 600, _BLOCK_CELLS // 3 + 1]),
    pairs=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**9)), max_size=300),
)
def test_numbering_matches_unique(nparts, pairs):
    src = np.sort(np.array([a % nparts for a, _ in pairs], dtype=np.int32))
    dst = np.array([b % nparts for _, b in pairs], dtype=np.int32)
    keys, ids = _number_pairs(src, dst, nparts)
    expected, inverse = np.unique(src.astype(np.int64) * nparts + dst, return_inverse=True)
    assert keys.tolist() == expected.tolist()
    assert ids.tolist() == inverse.tolist()
