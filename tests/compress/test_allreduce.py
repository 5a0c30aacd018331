import numpy as np
import pytest

from commflow.compress import Codec, ErrorFeedback, decode, encode, quantized_allreduce
from commflow.errors import CommflowError
from tests.runtime.harness import run_world

N = 3000  # not a multiple of nranks * block: exercises padding
BLOCK = 64


def _input(rank):
    return (np.random.default_rng(rank).standard_normal(N) * (rank + 1)).astype(np.float32)


def _allreduce(comm, name):
    out, stats = quantized_allreduce(comm, _input(comm.rank), codec=Codec(name=name, block=BLOCK),
                                     measure_error=True)
    return out, stats


def _bound(nranks, qmax):
    """sum_r s_r / 2 (each rank's quantization) + s_red / 2 (requantizing the reduced shard),
    with s_red <= (absmax of the exact block + sum_r s_r / 2) / qmax."""
    size = -(-N // (nranks * BLOCK)) * BLOCK * nranks
    xs = [np.pad(_input(r), (0, size - N)).reshape(-1, BLOCK) for r in range(nranks)]
    s = sum(np.abs(x).max(axis=1) / qmax for x in xs) / 2
    exact = np.abs(sum(xs)).max(axis=1)
    per_block = s + (exact + s) / qmax / 2
    return np.repeat(per_block, BLOCK)[:N], sum(xs).reshape(-1)[:N]


@pytest.mark.parametrize(("nranks", "name", "qmax"), [(2, "int8", 127), (4, "int8", 127),
                                                     (4, "int4", 7)])
def test_int_allreduce_within_derived_bound(nranks, name, qmax):
    results = run_world(_allreduce, nranks, name)
    bound, exact = _bound(nranks, qmax)
    for out, stats in results:
        np.testing.assert_array_equal(out, results[0][0])
        assert np.all(np.abs(out - exact) <= bound * (1 + 1e-5) + 1e-5)
        assert 0 < stats.relative_error < (0.02 if name == "int8" else 0.3)
        b = -(-N // (nranks * BLOCK)) // 1 * (4 + (BLOCK if name == "int8" else BLOCK // 2))
        assert stats.bytes_sent == 2 * (nranks - 1) * b


def test_bf16_allreduce_and_bytes():
    (out, stats), _ = run_world(_allreduce, 2, "bf16")
    exact = _input(0) + _input(1)
    np.testing.assert_allclose(out, exact, rtol=2e-2, atol=2e-2)
    assert stats.bytes_sent * 2 <= stats.float32_bytes + 2 * 4 * BLOCK


def _feedback(comm):
    ef = ErrorFeedback()
    total, sent = np.zeros(N, np.float32), np.zeros(N, np.float32)
    for t in range(10):
        g = _input(comm.rank + 10 * t)
        out, _ = quantized_allreduce(comm, g, codec=Codec(name="int4", block=BLOCK), feedback=ef)
        total += comm.allreduce(g)
        sent += out
    return total, sent, comm.allreduce(ef.residual("x"))


def test_error_feedback_keeps_the_sum_within_residuals():
    for total, sent, residual in run_world(_feedback, 2):
        # what is left out of the sum is the ranks' residuals plus the last requantization
        assert np.abs(total - sent - residual).max() < np.abs(total).max() / 7


def _reference(comm, x, codec):
    """The exchange stated with encode/decode alone, one piece: decode and add each rank's
    part in rank order, encode the sum, decode every rank's reduced shard."""
    shard = -(-x.size // (comm.size * codec.block)) * codec.block
    padded = np.zeros(shard * comm.size, np.float32)
    padded[:x.size] = x
    got = comm.alltoall(np.concatenate([encode(padded[j * shard:(j + 1) * shard], codec)
                                        for j in range(comm.size)]))
    reduced = np.zeros(shard, np.float32)
    for part in np.split(got, comm.size):
        decode(part, shard, codec, add_to=reduced)
    gathered = comm.allgather(encode(reduced, codec))
    return np.concatenate([decode(p, shard, codec) for p in np.split(gathered, comm.size)])[:x.size]


def _pieces(comm, name):
    codec = Codec(name=name, block=BLOCK)
    x = _input(comm.rank)
    quantized_allreduce(comm, np.tile(x, 3), codec=codec)  # leaves larger buffers to reuse
    given = np.full(N, np.nan, np.float32)  # padded: the sum is copied in
    assert quantized_allreduce(comm, x, codec=codec, out=given)[0] is given
    return [quantized_allreduce(comm, x, codec=codec, pieces=p)[0] for p in (1, 3, 7)] + [
        given, _reference(comm, x, codec)]


def _into(comm):
    codec = Codec(block=BLOCK)
    x = _input(comm.rank)[:comm.size * BLOCK * 10]  # no padding: decoded straight into out
    given = np.full(x.size, np.nan, np.float32)
    assert quantized_allreduce(comm, x, codec=codec, out=given)[0] is given
    with pytest.raises(CommflowError, match="rank .: out must be a contiguous float32 array "
                                            r"of shape \(1920,\)"):
        quantized_allreduce(comm, x, codec=codec, out=np.empty(x.size, np.float64))
    return given, _reference(comm, x, codec)


def test_out_receives_the_sum():
    for given, expected in run_world(_into, 3):
        np.testing.assert_array_equal(given, expected)


@pytest.mark.parametrize("name", ["int8", "int4", "bf16"])
def test_pipelined_pieces_and_fused_reduce_equal_the_plain_exchange(name):
    for outs in run_world(_pieces, 3, name):
        for out in outs[:-1]:
            np.testing.assert_array_equal(out, outs[-1])
