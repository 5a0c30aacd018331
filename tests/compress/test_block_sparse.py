"""Block-sparse allreduce: exact float32 sums while sending only the union of non-zero
blocks."""

import numpy as np
import pytest

from commflow.compress import block_sparse_allreduce
from commflow.errors import CommflowError
from tests.runtime.harness import run_world

N, BLOCK = 10_000, 64


def _input(rank):
    """Sparse gradients: a few dense blocks per rank, partly shared between ranks, and an
    array length that is not a multiple of the block."""
    rng = np.random.default_rng(rank)
    x = np.zeros(N, np.float32)
    for start in (0, 640, 64 * (10 + rank), 64 * (150 - rank)):
        x[start:start + 40] = rng.standard_normal(40)
    x[-3:] = rank + 1
    return x


def _run(comm):
    out, stats = block_sparse_allreduce(comm, _input(comm.rank), block=BLOCK,
                                        measure_error=True)
    empty, none = block_sparse_allreduce(comm, np.zeros(100, np.float32), block=BLOCK)
    with pytest.raises(CommflowError, match="1-D float32"):
        block_sparse_allreduce(comm, np.zeros(4, np.float64))
    return out, stats, empty, none


@pytest.mark.parametrize("nranks", [2, 3])
def test_sums_exactly_and_counts_union_blocks(nranks):
    exact = sum(_input(r).astype(np.float64) for r in range(nranks))
    union = np.unique(np.concatenate([np.flatnonzero(_input(r)) // BLOCK
                                      for r in range(nranks)]))
    blocks = -(-N // BLOCK)
    for out, stats, empty, none in run_world(_run, nranks):
        np.testing.assert_allclose(out, exact, rtol=1e-6, atol=1e-6)
        assert stats.relative_error < 1e-6
        bitmap = (nranks - 1) * -(-blocks // 8)
        ring = 2 * (nranks - 1) * 4 * -(-len(union) * BLOCK // nranks)
        assert stats.bytes_sent == bitmap + ring
        assert stats.bytes_sent < stats.float32_bytes / 10
        assert not empty.any() and none.bytes_sent == (nranks - 1) * 1
