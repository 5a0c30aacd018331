"""PowerSGD hook: one step against a numpy statement of the algorithm, and training on two
ranks that reaches float32 DDP's loss (and torch's own PowerSGD hook's) with error
feedback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from commflow.errors import CommflowError
from commflow.torch import powersgd

from .harness import Bucket, run_group, train_regression

SHAPES = [(16, 12), (7,), (9, 10)]


def grads(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rank + 10)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _one_step():
    state = powersgd.PowerSGDState(rank=3, min_compression_rate=1.5, seed=5)
    arrays = grads(dist.get_rank())
    bucket = Bucket(0, torch.from_numpy(np.concatenate([a.ravel() for a in arrays])), SHAPES)
    out = powersgd.powersgd_hook(state, bucket).wait()
    with pytest.raises(CommflowError, match="rank must be >= 1"):
        powersgd.PowerSGDState(rank=0)
    errors = {k: v.numpy().copy() for k, v in state.errors.items()}
    return out.numpy().copy(), errors, state.bytes_sent, state.bytes_uncompressed


def test_one_step_matches_the_algorithm():
    results = run_group(_one_step, 2)
    per_rank = [grads(r) for r in range(2)]
    state = powersgd.PowerSGDState.__new__(powersgd.PowerSGDState)
    state.seed = 5
    expected, errors = [], {}
    for i, shape in enumerate(SHAPES):
        ms = [g[i].reshape(shape[0], -1).astype(np.float64) for g in per_rank]
        if len(shape) < 2:
            expected.append(np.mean(ms, axis=0).ravel())
            continue
        q0 = powersgd._first_q(state, (0, i), ms[0].shape[1], 3).numpy().astype(np.float64)
        p, _ = np.linalg.qr(np.mean([m @ q0 for m in ms], axis=0))
        q = np.mean([m.T @ p for m in ms], axis=0)
        approx = p @ q.T
        expected.append(approx.ravel())
        errors[i] = [m - approx for m in ms]
    want = np.concatenate(expected)
    for rank, (out, errs, sent, raw) in enumerate(results):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
        for i, e in errors.items():
            np.testing.assert_allclose(errs[(0, i)], e[rank], rtol=1e-4, atol=1e-5)
        assert sent == 4 * (7 + (16 + 12) * 3 + (9 + 10) * 3)
        assert raw == 4 * (16 * 12 + 7 + 9 * 10)


def _three_runs():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                   torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                   torch.nn.Linear(64, 1))

    theirs = torch_psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                      start_powerSGD_iter=2, min_compression_rate=2)
    return {"float32": train_regression(mlp(), steps=120),
            "commflow": train_regression(mlp(), (powersgd.PowerSGDState(rank=4),
                                                 powersgd.powersgd_hook), steps=120),
            "torch": train_regression(mlp(), (theirs, torch_psgd.powerSGD_hook), steps=120)}


def test_training_reaches_float32_loss_with_error_feedback():
    results = run_group(_three_runs, 2, timeout=120.0)
    runs = results[0]
    start = runs["float32"][0]
    final = {k: float(np.mean(v[-10:])) for k, v in runs.items()}
    assert final["float32"] < 0.05 * start
    # rank-4 PowerSGD with error feedback (8x fewer bytes on the 64x64 layer) ends within 2x
    # of float32's loss, and within 1.5x of torch's own PowerSGD hook
    assert final["commflow"] < 2 * final["float32"] + 0.01 * start
    assert final["commflow"] < 1.5 * final["torch"] + 0.01 * start
