"""The connection numbering behind :class:`commflow.sim.paths.Connections`
(:func:`commflow.sim.kernels.number_connections`), against numpy's sort-based ``unique``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.ir import Op
from commflow.sim.kernels import number_connections


@settings(max_examples=40, deadline=None)
@given(
    nparts=st.sampled_from([2, 3, 7, 1000]),
    rows=st.lists(st.tuples(*[st.integers(0, 10**9)] * 2, st.integers(0, 3), st.integers(1, 9))),
    local=st.integers(0, 5),
)
def test_numbering_matches_unique(nparts, rows, local):
    rows = sorted((a % nparts, c, b, k) for a, b, c, k in rows)
    part = np.array([a for a, *_ in rows], dtype=np.int32)
    chan = np.array([c for _, c, *_ in rows], dtype=np.int32)
    peer = np.array([(a + b % (nparts - 1) + 1) % nparts for a, _, b, _ in rows], dtype=np.int32)
    count = np.array([k for *_, k in rows], dtype=np.int32)
    # every send followed by a local step of its channel, then ``local`` more on a last one
    n = 2 * len(rows) + local
    sends = np.arange(len(rows), dtype=np.int64) * 2
    step_part = np.full(n, nparts, dtype=np.int64)
    step_chan = np.zeros(n, dtype=np.int64)
    step_part[sends], step_part[sends + 1] = part, part
    step_chan[sends], step_chan[sends + 1] = chan, chan
    step_peer, step_count = np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32)
    step_peer[sends], step_count[sends] = peer, count
    op = np.full(n, Op.COPY, dtype=np.int8)
    op[sends] = Op.SEND
    key = step_part * 4 + step_chan
    starts = np.flatnonzero(np.diff(key, prepend=-1)).tolist() + [n]
    starts = np.array(starts if n else [0], dtype=np.int64)
    of_step = np.full(n, -1, dtype=np.int32)
    keys, chunks, lowest, highest = number_connections(
        step_peer, step_count, op, int(Op.SEND), starts, step_part[starts[:-1]], nparts, of_step
    )
    expected, inverse = np.unique(part.astype(np.int64) * nparts + peer, return_inverse=True)
    assert keys.tolist() == expected.tolist()
    assert of_step[sends].tolist() == inverse.tolist()
    assert (of_step[1::2] == -1).all()
    assert chunks.tolist() == np.bincount(inverse, weights=count, minlength=len(keys)).tolist()
    channel = np.searchsorted(starts, sends, side="right") - 1  # the channel of each send
    for c in range(len(keys)):
        assert lowest[c] == channel[inverse == c].min()
        assert highest[c] == channel[inverse == c].max()
