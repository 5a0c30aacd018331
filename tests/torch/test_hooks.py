"""The comm hooks' arithmetic, exactly: average, and half-precision compression with and
without error feedback, over two steps, against numpy on every rank's known gradients."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.distributed as dist

from commflow.errors import AlgorithmError, CommflowError
from commflow.torch import hooks

from .harness import Bucket, run_group

N = 2
WIRE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def gradient(rank: int) -> np.ndarray:
    """Rank ``rank``'s bucket: values that float16 and bfloat16 do not hold exactly."""
    return np.linspace(-1.0, 1.0, 9, dtype=np.float32) * (rank + 1) / 3 + np.float32(1e-3) * rank


def _two_steps(state) -> list[tuple[list[float], list[float]]]:
    """(averaged bucket, residual) after each of two steps with the same gradients."""
    hook = (
        hooks.allreduce_hook if type(state) is hooks.HookState else hooks.compressed_allreduce_hook
    )
    steps = []
    for _ in range(2):
        buffer = torch.from_numpy(gradient(dist.get_rank()))
        averaged = hook(state, Bucket(3, buffer)).wait()
        assert averaged is buffer
        residual = getattr(state, "residuals", {}).get(3)
        steps.append((averaged.tolist(), None if residual is None else residual.tolist()))
    return steps


def _hooks() -> dict[str, object]:
    return {
        "ring": _two_steps(hooks.HookState(algo="ring")),
        "float16": _two_steps(hooks.CompressionState(dtype=torch.float16)),
        "bfloat16": _two_steps(hooks.CompressionState(dtype=torch.bfloat16)),
        "float16 no feedback": _two_steps(
            hooks.CompressionState(dtype=torch.float16, error_feedback=False)
        ),
    }


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_group(_hooks, N)


def _expected(wire: type, feedback: bool) -> list[tuple[np.ndarray, list[np.ndarray]]]:
    residual = [np.zeros(9, np.float32) for _ in range(N)]
    steps = []
    for _ in range(2):
        compensated = [gradient(r) + residual[r] if feedback else gradient(r) for r in range(N)]
        sent = [(c / np.float32(N)).astype(wire) for c in compensated]
        residual = [
            c - s.astype(np.float32) * np.float32(N) for c, s in zip(compensated, sent, strict=True)
        ]
        steps.append(((sent[0] + sent[1]).astype(np.float32), residual))
    return steps


def test_allreduce_hook_averages(results):
    average = (gradient(0) + gradient(1)) / np.float32(N)
    for res in results:
        for averaged, residual in res["ring"]:
            np.testing.assert_array_equal(averaged, average)
            assert residual is None


@pytest.mark.parametrize("wire", sorted(WIRE))
def test_compressed_hook_carries_rounding_error_to_the_next_step(results, wire):
    expected = _expected(WIRE[wire], feedback=True)
    for r, res in enumerate(results):
        for (averaged, residual), (average, residuals) in zip(res[wire], expected, strict=True):
            np.testing.assert_array_equal(averaged, average)
            np.testing.assert_array_equal(residual, residuals[r])
    first, second = expected
    assert np.any(first[0] != second[0])  # the feedback changes what is sent
    assert np.any(first[1][0] != 0)


def test_compressed_hook_without_feedback_keeps_no_residual(results):
    (first, _), (second, _) = _expected(np.float16, feedback=False)
    for res in results:
        (a, residual_a), (b, residual_b) = res["float16 no feedback"]
        np.testing.assert_array_equal(a, first)
        np.testing.assert_array_equal(b, second)
        assert residual_a is None and residual_b is None


def test_states_reject_bad_settings_before_any_communication():
    with pytest.raises(AlgorithmError, match="HookState.algo: no algorithm 'best' for allreduce"):
        hooks.HookState(algo="best")
    with pytest.raises(CommflowError, match="dtype must be torch.float16 or torch.bfloat16"):
        hooks.CompressionState(dtype=torch.float32)
    with pytest.raises(CommflowError, match="process_group must be a commflow group"):
        hooks.HookState(process_group=object())
