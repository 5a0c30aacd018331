import numpy as np
import pytest

from commflow.compress import ErrorFeedback, topk_allreduce
from commflow.errors import CommflowError
from tests.runtime.harness import run_world

N, K = 1000, 50


def _input(rank):
    return np.random.default_rng(rank).standard_normal(N).astype(np.float32)


def _reference(nranks):
    out = np.zeros(N, np.float32)
    for r in range(nranks):
        x = _input(r)
        top = np.argsort(-np.abs(x))[:K]
        out[top] += x[top]
    return out


def _topk(comm):
    ef = ErrorFeedback()
    out, stats = topk_allreduce(comm, _input(comm.rank), k=K, feedback=ef)
    residual = ef.residual("x")
    with pytest.raises(CommflowError, match="k=0"):
        topk_allreduce(comm, _input(0), k=0)
    return out, stats.bytes_sent, residual


def test_topk_matches_numpy_reference_and_keeps_the_rest():
    for rank, (out, sent, residual) in enumerate(run_world(_topk, 2)):
        np.testing.assert_allclose(out, _reference(2), rtol=1e-6)
        assert sent == 8 * K
        x = _input(rank)
        assert np.count_nonzero(residual) == N - K
        np.testing.assert_array_equal(residual[residual != 0], x[residual != 0])
