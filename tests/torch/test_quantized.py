"""int8/int4 DDP hook: one bucket against a numpy statement of the exchange (exact), its
error bound against the true mean, the residual, and training against float32 DDP."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from commflow.compress import Codec, decode, encode, scales
from commflow.compress import ddp_hook as quantized
from commflow.errors import CommflowError

from .harness import Bucket, run_group, train_regression

N = 1000


def gradient(rank: int) -> np.ndarray:
    return np.random.default_rng(rank).standard_normal(N).astype(np.float32)


def _hook(codec):
    state = quantized.QuantizedState(codec=codec, block=64)
    out = quantized.quantized_allreduce_hook(
        state, Bucket(0, torch.from_numpy(gradient(dist.get_rank())))).wait()
    with pytest.raises(CommflowError, match="codec must be 'int8' or 'int4'"):
        quantized.QuantizedState(codec="fp16")
    return out.numpy().copy(), state.residuals[0].copy(), state.bytes_sent


def _reference(nranks: int, codec: Codec) -> tuple[np.ndarray, list[np.ndarray]]:
    """The same exchange written in numpy, all ranks in one process."""
    shard = -(-N // (nranks * codec.block)) * codec.block
    padded = [np.zeros(shard * nranks, np.float32) for _ in range(nranks)]
    for r in range(nranks):
        padded[r][:N] = gradient(r) / nranks
    sent = [[decode(encode(p[j * shard:(j + 1) * shard], codec), shard, codec)
             for j in range(nranks)] for p in padded]
    reduced = [np.zeros(shard, np.float32) for _ in range(nranks)]
    for j in range(nranks):
        for r in range(nranks):
            reduced[j] += sent[r][j]
    out = np.concatenate([decode(encode(reduced[j], codec), shard, codec)
                          for j in range(nranks)])
    residuals = [padded[r] - np.concatenate(sent[r]) for r in range(nranks)]
    return out[:N], residuals


@pytest.mark.parametrize(("codec", "nranks"), [("int8", 2), ("int4", 3)])
def test_one_bucket_matches_the_stated_exchange_and_its_bound(codec, nranks):
    spec = Codec(name=codec, block=64)
    want, residuals = _reference(nranks, spec)
    mean = sum(gradient(r).astype(np.float64) for r in range(nranks)) / nranks
    for rank, (out, residual, sent) in enumerate(run_group(_hook, nranks, codec)):
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(residual, residuals[rank])
        shard = -(-N // (nranks * 64)) * 64
        assert sent == (nranks - 1) * 2 * spec.encoded_bytes(shard)
    # each contribution is within half its scale, the sum within half the sum's scale
    shard = -(-N // (nranks * 64)) * 64
    padded = [np.zeros(shard * nranks, np.float32) for _ in range(nranks)]
    for r in range(nranks):
        padded[r][:N] = gradient(r) / nranks
    bound = sum(np.repeat(scales(p, spec), 64) / 2 for p in padded)
    total = np.zeros(shard * nranks, np.float32)
    for p in padded:
        total += p
    bound = bound + np.repeat(scales(np.abs(total) + bound.astype(np.float32), spec), 64) / 2
    assert np.all(np.abs(want - mean) <= bound[:N] + 1e-6)


def _runs():
    from commflow.torch import topk

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                   torch.nn.Linear(64, 1))

    hook = quantized.quantized_allreduce_hook
    return {"float32": train_regression(mlp()),
            "int8": train_regression(mlp(), (quantized.QuantizedState(codec="int8"), hook)),
            "int4": train_regression(mlp(), (quantized.QuantizedState(codec="int4"), hook)),
            "top-10%": train_regression(mlp(), (topk.TopKState(ratio=0.1),
                                                topk.topk_allreduce_hook))}


def test_training_with_error_feedback_reaches_float32_loss():
    # int8 and int4 hooks and the top-k hook (10% of entries) against float32 DDP
    runs = run_group(_runs, 2, timeout=120.0)[0]
    start = runs["float32"][0]
    final = {k: float(np.mean(v[-10:])) for k, v in runs.items()}
    assert final["float32"] < 0.1 * start
    assert final["int8"] < 1.1 * final["float32"] + 0.01 * start
    assert final["int4"] < 2 * final["float32"] + 0.02 * start
    assert final["top-10%"] < 3 * final["float32"] + 0.03 * start


def _topk_bucket():
    from commflow.torch import topk

    state = topk.TopKState(ratio=0.05)
    grad = gradient(dist.get_rank())
    out = topk.topk_allreduce_hook(state, Bucket(0, torch.from_numpy(grad.copy()))).wait()
    with pytest.raises(CommflowError, match="ratio must be in"):
        topk.TopKState(ratio=0.0)
    return out.numpy().copy(), state.residuals[0].numpy().copy(), state.bytes_sent


def test_topk_hook_sums_each_ranks_largest_entries_and_keeps_the_rest():
    k = 50  # 5% of 1000
    want = np.zeros(N, np.float64)
    for r in range(2):
        contribution = gradient(r) / 2
        top = np.argsort(-np.abs(contribution))[:k]
        want[top] += contribution[top]
    for rank, (out, residual, sent) in enumerate(run_group(_topk_bucket, 2)):
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
        contribution = gradient(rank) / 2
        assert np.count_nonzero(residual) == N - k
        np.testing.assert_array_equal(residual[residual != 0], contribution[residual != 0])
        assert sent == 8 * k


