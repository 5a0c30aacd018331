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
    rows = sorted((a % nparts, b, c, k) for a, b, c, k in rows)
    part = np.array([a for a, *_ in rows], dtype=np.int32)
    peer = np.array([(a + b % (nparts - 1) + 1) % nparts for a, b, *_ in rows], dtype=np.int32)
    chan = np.array([c for _, _, c, _ in rows], dtype=np.int32)
    count = np.array([k for *_, k in rows], dtype=np.int32)
    # local steps (not sends) interleaved: every other step is a send
    n = 2 * len(rows) + local
    sends = np.arange(len(rows), dtype=np.int64) * 2
    full = {name: np.zeros(n, dtype=np.int32) for name in ("part", "peer", "chan", "count")}
    for name, col in (("part", part), ("peer", peer), ("chan", chan), ("count", count)):
        full[name][sends] = col
    full["part"][sends + 1] = part  # the local step after each send, on the same participant
    full["part"][2 * len(rows) :] = nparts - 1
    op = np.full(n, Op.COPY, dtype=np.int8)
    op[sends] = Op.SEND
    of_step = np.full(n, -1, dtype=np.int32)
    keys, chunks, lowest, highest = number_connections(
        full["part"], full["peer"], full["chan"], full["count"], op, int(Op.SEND), nparts, of_step
    )
    expected, inverse = np.unique(part.astype(np.int64) * nparts + peer, return_inverse=True)
    assert keys.tolist() == expected.tolist()
    assert of_step[sends].tolist() == inverse.tolist()
    assert (of_step[1::2] == -1).all()
    assert chunks.tolist() == np.bincount(inverse, weights=count, minlength=len(keys)).tolist()
    nchan = int(chan.max(initial=0)) + 1
    stream = part.astype(np.int64) * nchan + chan
    for c in range(len(keys)):
        assert lowest[c] == stream[inverse == c].min()
        assert highest[c] == stream[inverse == c].max()
