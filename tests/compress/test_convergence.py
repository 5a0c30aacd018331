"""The int8 DDP hook with error feedback trains the transformer of examples/train_ddp.py to
float32's loss: 2 ranks, a small GPT on the example's Markov language, 60 Adam steps each way
from the same initial weights and data; the mean loss of the last 10 steps with int8 buckets
must be within 1% of float32's, both far below the start (ln 64 = 4.16)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from commflow.compress import ddp_hook
from tests.torch.harness import run_group

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
STEPS, TAIL, VOCAB = 60, 10, 64


def _example():
    spec = importlib.util.spec_from_file_location("train_ddp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(codec: str | None) -> list[float]:
    example = _example()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(example.GPT(VOCAB, 32, 64, 2, 2), bucket_cap_mb=1)
    if codec is not None:
        ddp.register_comm_hook(ddp_hook.QuantizedState(codec=codec),
                               ddp_hook.quantized_allreduce_hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    data = example.MarkovText(VOCAB, 32, 8, seed=dist.get_rank())
    losses = []
    for _ in range(STEPS):
        x, y = data.next()
        loss = torch.nn.functional.cross_entropy(ddp(x).reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _both() -> tuple[list[float], list[float]]:
    return _train(None), _train("int8")


def test_int8_hook_with_error_feedback_reaches_float32_loss_on_the_transformer():
    (full, int8), _ = run_group(_both, 2, timeout=120)
    tail = [sum(losses[-TAIL:]) / TAIL for losses in (full, int8)]
    assert full[0] > 4.0 and tail[0] < 0.75 * full[0]
    assert abs(tail[1] - tail[0]) <= 0.01 * tail[0], tail
