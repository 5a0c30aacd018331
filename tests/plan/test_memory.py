"""Memory per GPU against the closed forms of REFERENCES.md (Korthikanti; ZeRO bytes)."""

from __future__ import annotations

import pytest

from commflow.plan import MODELS, Plan, TransformerSpec, memory_per_gpu
from commflow.plan.memory import WORKSPACE_BYTES, in_flight, stage_params

GPT = MODELS["gpt3-175b"]  # s=2048, h=12288, a=96, l=96, V=51200


@pytest.mark.parametrize(
    ("zero", "state_bytes"), [(0, 16), (1, 4 + 12 / 8), (2, 2 + 14 / 8), (3, 16 / 8)]
)
def test_zero_stages_shard_state_over_dp(zero, state_bytes):
    plan = Plan(tp=8, pp=8, dp=8, global_batch=64, zero=zero)
    assert memory_per_gpu(GPT, plan).states == pytest.approx(stage_params(GPT, plan) * state_bytes)


def test_stage_params_first_stage_holds_embedding():
    plan = Plan(tp=8, pp=8, dp=1, global_batch=8)
    expected = (12 * 12288**2 + 13 * 12288) * 12 + (51200 + 2048) * 12288
    assert stage_params(GPT, plan) == pytest.approx(expected / 8)


def test_korthikanti_activations_per_recompute_mode():
    s, b, h, a, t, layers = 2048, 1, 12288, 96, 8, 12
    base = dict(tp=t, pp=8, dp=1, mb=b, global_batch=64, sp=True)
    inflight = 8  # 1F1B first stage: p micro-batches
    none = memory_per_gpu(GPT, Plan(**base, recompute="none")).activations
    assert none == pytest.approx(s * b * h / t * (34 + 5 * a * s / h) * layers * inflight)
    selective = memory_per_gpu(GPT, Plan(**base, recompute="selective")).activations
    assert selective == pytest.approx(s * b * h / t * 34 * layers * inflight)
    full = memory_per_gpu(GPT, Plan(**base, recompute="full")).activations
    one_layer = s * b * h / t * (34 + 5 * a * s / h)
    assert full == pytest.approx(2 * s * b * h / t * layers * inflight + one_layer)


def test_without_sequence_parallel():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    plan = Plan(tp=t, pp=96, dp=1, mb=b, global_batch=96)
    per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    assert memory_per_gpu(GPT, plan).activations == pytest.approx(per_layer * 1 * 96)


def test_in_flight_per_schedule():
    assert in_flight(Plan(pp=4, global_batch=16, schedule="gpipe")) == 16
    assert in_flight(Plan(pp=4, global_batch=16)) == 4
    assert in_flight(Plan(pp=4, global_batch=2)) == 2
    assert in_flight(Plan(pp=4, vp=2, global_batch=16, schedule="interleaved")) == 4 * (1 + 3 / 8)


def test_buffers_and_total():
    plan = Plan(tp=8, pp=8, dp=8, global_batch=64, zero=3)
    memory = memory_per_gpu(GPT, plan)
    logits = 4 * 2048 * 51200 / 8
    gathered = 2 * (12 * 12288**2 + 13 * 12288) / 8
    assert memory.buffers == pytest.approx(WORKSPACE_BYTES + logits + gathered)
    assert memory.total == memory.states + memory.activations + memory.buffers
    assert memory.to_dict()["total"] == pytest.approx(memory.total / 2**30)


def test_expert_parallel_splits_only_the_experts():
    moe = TransformerSpec(
        name="moe", hidden=1024, layers=4, heads=8, vocab=1000, seq=512, experts=8, top_k=2
    )
    experts = 8 * 2 * 1024 * 4096
    plan = Plan(tp=2, pp=2, dp=4, ep=4, global_batch=8)
    expected = (2 * (moe.layer_params - experts + experts / 4) + moe.embedding_params) / 2
    assert stage_params(moe, plan) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("zero", "weights", "gradients", "optimizer"),
    [(0, 2, 2, 12), (1, 2, 2, 12 / 8), (2, 2, 2 / 8, 12 / 8), (3, 2 / 8, 2 / 8, 12 / 8)],
)
def test_state_parts_per_zero_stage(zero, weights, gradients, optimizer):
    plan = Plan(tp=8, pp=8, dp=8, global_batch=64, zero=zero)
    memory, params = memory_per_gpu(GPT, plan), stage_params(GPT, plan)
    assert (memory.weights, memory.gradients, memory.optimizer) == pytest.approx(
        (params * weights, params * gradients, params * optimizer))
    parts = memory.to_dict()
    assert list(parts) == ["weights", "gradients", "optimizer", "activations", "buffers", "total"]
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
