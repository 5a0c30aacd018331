"""DistributedDataParallel over commflow trains like over gloo: same script, same seed, several
buckets, parameters equal within float32 reduction-order tolerance; also through the comm
hooks, on 2 ranks (commflow default group) and 4 ranks (gloo default group)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commflow.torch import hooks

from .harness import run_group

STEPS = 5
BUCKET_MB = 0.002
"""2 KB buckets: three buckets for the four layers (after DDP rebuilds them)."""


def _model() -> torch.nn.Module:
    """The test model, with the same initial parameters on every call (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 4),
    )


def _train(group=None, hook=None) -> tuple[list[np.ndarray], str]:
    """Parameters after STEPS of SGD with momentum on rank-dependent data, and DDP's
    bucket sizes (bytes) after its rebuild."""
    model = _model()
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=BUCKET_MB)
    if hook is not None:
        ddp.register_comm_hook(*hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=data)
        loss = (ddp(x) - x[:, :4]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    buckets = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    return [p.detach().numpy().copy() for p in model.parameters()], buckets


def _on_commflow_default() -> dict[str, object]:
    gloo = dist.new_group(backend="gloo")
    return {
        "gloo": _train(gloo),
        "commflow": _train(),
        "ring hook on gloo DDP": _train(gloo, (hooks.HookState(algo="ring"), hooks.allreduce_hook)),
        "bf16 hook": _train(
            hook=(hooks.CompressionState(dtype=torch.bfloat16), hooks.compressed_allreduce_hook)
        ),
    }


def _on_gloo_default() -> dict[str, object]:
    commflow_group = dist.new_group(backend="commflow")
    return {
        "gloo": _train(),
        "commflow": _train(commflow_group),
        "recursive doubling hook on gloo DDP": _train(
            hook=(hooks.HookState(algo="recursive_doubling"), hooks.allreduce_hook)
        ),
    }


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    return run_group(_on_commflow_default, 2)


@pytest.fixture(scope="module")
def four_ranks() -> list[dict]:
    return run_group(_on_gloo_default, 4, backend="gloo")


def _assert_close(params, reference, **tol) -> None:
    for p, q in zip(params, reference, strict=True):
        np.testing.assert_allclose(p, q, **tol)


def _check(results: list[dict], runs: list[str]) -> None:
    for res in results:
        reference, buckets = res["gloo"]
        assert len(buckets.split(",")) == 3
        for run in runs:
            params, same_buckets = res[run]
            assert same_buckets == buckets
            _assert_close(params, reference, rtol=1e-5, atol=1e-6)
    for run in runs:  # replicas stay identical
        for res in results[1:]:
            _assert_close(res[run][0], results[0][run][0], rtol=0, atol=0)


def test_ddp_on_commflow_matches_gloo_on_2_ranks(two_ranks):
    _check(two_ranks, ["commflow", "ring hook on gloo DDP"])


def test_ddp_on_commflow_group_matches_gloo_on_4_ranks(four_ranks):
    _check(four_ranks, ["commflow", "recursive doubling hook on gloo DDP"])


def test_bfloat16_hook_with_error_feedback_tracks_float32_training(two_ranks):
    for res in two_ranks:
        reference, _ = res["gloo"]
        params, _ = res["bf16 hook"]
        moved = max(np.abs(p - q).max() for p, q in zip(reference, _train_start(), strict=True))
        gap = max(np.abs(p - q).max() for p, q in zip(params, reference, strict=True))
        assert 0 < gap < 0.02 * moved


def _train_start() -> list[np.ndarray]:
    model = _model()
    return [p.detach().numpy() for p in model.parameters()]
