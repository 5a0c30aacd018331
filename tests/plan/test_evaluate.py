"""evaluate(): consistency of outputs, effects of plan choices, errors."""

from __future__ import annotations

import pytest

from commflow.errors import CommflowError
from commflow.plan import MODELS, Plan, TransformerSpec, evaluate
from commflow.plan.compute import model_flops

SMALL = Plan(tp=8, pp=2, dp=2, mb=1, global_batch=32, sp=True, recompute="selective")


def test_outputs_are_consistent():
    result = evaluate("gpt3-6.7b", "dgx-a100x4", SMALL)
    spec = MODELS["gpt3-6.7b"]
    assert sum(result.breakdown.values()) == pytest.approx(result.step_time, rel=1e-12)
    assert all(v >= -1e-12 for v in result.breakdown.values())
    assert result.tokens_per_s == pytest.approx(32 * spec.seq / result.step_time)
    flops = model_flops(spec, 32, recompute=False)
    assert result.tflops_per_gpu_model == pytest.approx(flops / result.step_time / 32 / 1e12)
    assert result.mfu == pytest.approx(result.tflops_per_gpu_model * 1e12 / 312e12)
    assert result.tflops_per_gpu_hw > result.tflops_per_gpu_model  # selective recompute
    record = result.to_dict()
    assert set(record) == {"plan", "step_time_s", "tokens_per_s", "tflops_per_gpu_hw",
                           "tflops_per_gpu_model", "mfu", "memory_per_gpu_gib", "memory_gib",
                           "fits", "breakdown", "stage_layers", "stage_accelerators"}  # fmt: skip
    assert record["stage_layers"] == [16.0] * 2 and record["stage_accelerators"] == [
        "a100-80gb"] * 2


def test_megatron_flops_formulas():
    spec = MODELS["megatron-1t"]
    b, s, n_layers, h, v = 3072, spec.seq, spec.layers, spec.hidden, spec.vocab
    full = 96 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (16 * n_layers * h))
    none = 72 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (12 * n_layers * h))
    assert model_flops(spec, b, recompute=True) == pytest.approx(full, rel=1e-12)
    assert model_flops(spec, b, recompute=False) == pytest.approx(none, rel=1e-12)


def test_plan_choices_move_time_the_right_way():
    base = dict(tp=8, pp=2, dp=2, mb=1, global_batch=32, sp=True)
    none = evaluate("gpt3-6.7b", "dgx-a100x4", Plan(**base, recompute="none"))
    full = evaluate("gpt3-6.7b", "dgx-a100x4", Plan(**base, recompute="full"))
    assert full.step_time > none.step_time and full.memory.total < none.memory.total
    no_overlap = evaluate("gpt3-6.7b", "dgx-a100x4", Plan(**base, overlap=False))
    overlap = evaluate("gpt3-6.7b", "dgx-a100x4", Plan(**base))
    assert no_overlap.breakdown["dp"] > overlap.breakdown["dp"]
    h100 = evaluate("gpt3-6.7b", "dgx-h100x4", Plan(**base), accelerator="h100-sxm")
    assert h100.step_time < overlap.step_time


def test_exact_and_extrapolated_pipeline_agree():
    plan = Plan(tp=8, pp=4, dp=1, mb=1, global_batch=64, vp=2, schedule="interleaved")
    fast = evaluate("gpt3-6.7b", "dgx-a100x4", plan)
    exact = evaluate("gpt3-6.7b", "dgx-a100x4", plan, pipeline="exact")
    assert fast.step_time == pytest.approx(exact.step_time, rel=1e-9)


def test_too_big_does_not_fit():
    result = evaluate("gpt3-175b", "dgx-a100x2", Plan(tp=8, pp=2, dp=1, global_batch=8))
    assert not result.fits and result.memory.total > 80 * 2**30


@pytest.mark.parametrize(
    ("plan", "message"),
    [(Plan(tp=8, pp=2, dp=1, global_batch=8), "has 32 GPUs, not 16"),
     (Plan(tp=8, pp=4, dp=1, mb=2, global_batch=7), "multiple of dp"),
     (Plan(tp=16, pp=2, dp=1, global_batch=8), "box")],
)  # fmt: skip
def test_invalid_plans_raise(plan, message):
    with pytest.raises(CommflowError, match=message):
        evaluate("gpt3-6.7b", "dgx-a100x4", plan)


def test_unknown_names_raise():
    with pytest.raises(CommflowError, match="accelerator"):
        evaluate("gpt3-6.7b", "dgx-a100x2", SMALL, accelerator="tpu")
    with pytest.raises(CommflowError, match="pipeline"):
        evaluate("gpt3-6.7b", "dgx-a100x4", SMALL, pipeline="guess")


def test_context_and_expert_parallel_collectives_are_charged():
    moe = TransformerSpec(
        name="moe",
        hidden=4096,
        layers=8,
        heads=32,
        kv_heads=8,
        ffn=14336,
        vocab=32000,
        seq=8192,
        gated_mlp=True,
        experts=8,
        top_k=2,
    )
    plan = Plan(tp=4, cp=2, pp=1, dp=4, ep=2, mb=1, global_batch=8, sp=True)
    result = evaluate(moe, "dgx-a100x4", plan)
    assert result.breakdown["cp"] > 0 and result.breakdown["ep"] > 0
    assert sum(result.breakdown.values()) == pytest.approx(result.step_time, rel=1e-12)
    zero3 = evaluate(
        moe, "dgx-a100x4", Plan(tp=4, cp=2, pp=1, dp=4, ep=2, mb=1, global_batch=8, sp=True, zero=3)
    )
    assert zero3.breakdown["zero3_gather"] >= 0 and zero3.memory.states < result.memory.states


@pytest.mark.parametrize("dp", [8, 32])
def test_zero3_gathers_the_stage_parameters_once_per_pass(dp):
    """Without overlap, ZeRO-3 exposes per micro-batch one allgather of the stage's parameter
    bytes in the forward pass and one in the backward pass (DeepSpeed/FSDP): the allgather of
    ``layer_params * layers / tp * 2`` bytes, not that times dp (the bug of issue 14)."""
    from commflow.plan import resolve_cluster
    from commflow.plan.comm import cluster_links, collective_time

    spec = MODELS["gpt3-6.7b"]
    plan = Plan(tp=2, pp=1, dp=dp, mb=1, global_batch=2 * dp, zero=3, overlap=False)
    result = evaluate("gpt3-6.7b", "dgx-a100", plan)
    links = cluster_links(resolve_cluster("dgx-a100", plan.gpus))
    stage_bytes = spec.layers * spec.layer_params / plan.tp * 2
    once = collective_time("allgather", stage_bytes, dp, plan.tp, links)
    assert result.breakdown["zero3_gather"] == pytest.approx(2 * plan.microbatches * once,
                                                             rel=1e-9)
    # the same bytes gathered from more ranks: about the same time, not dp times more
    assert once < 2 * stage_bytes / links.network_bandwidth


def test_gpt3_175b_zero3_without_model_parallelism_is_compute_bound():
    """Issue 14's case: predicted 10,673 s before the fix; compute-bound (55.4 s) now."""
    plan = Plan(tp=1, pp=1, dp=384, zero=3, mb=4, global_batch=1536, recompute="full")
    result = evaluate("gpt3-175b", "dgx-a100x48", plan)
    assert result.step_time < 1.2 * result.breakdown["compute"]


def test_the_cluster_preset_implies_its_accelerator():
    from commflow.plan.hardware import implied_accelerator

    assert implied_accelerator("dgx-h100x4") == "h100-sxm"
    assert implied_accelerator("dgx-a100") == "a100-80gb"
    assert implied_accelerator("dgx1") == "v100"
    plan = Plan(tp=8, pp=1, dp=2, mb=1, global_batch=16)
    implied = evaluate("gpt3-6.7b", "dgx-h100", plan).step_time
    assert implied == evaluate("gpt3-6.7b", "dgx-h100", plan, accelerator="h100-sxm").step_time
    assert implied < evaluate("gpt3-6.7b", "dgx-h100", plan, accelerator="a100-80gb").step_time


def test_overlapped_gradient_reduction_leaves_the_last_layer_exposed():
    from commflow.plan.comm import cluster_links, collective_time
    from commflow.plan.evaluate import resolve_cluster
    from commflow.plan.memory import stage_params
    from commflow.plan.models import get_model

    spec = get_model("gpt3-1.3b")
    links = cluster_links(resolve_cluster("dgx-a100x2"))
    plan = Plan(tp=8, dp=2, mb=8, global_batch=16)
    grads = stage_params(spec, plan) * 2
    whole = collective_time("allreduce", grads, 2, 8, links)
    last = collective_time("allreduce", grads / spec.layers, 2, 8, links)
    # backward (~0.18 s) hides all but the reduction of the last layer's gradient
    for sched in ("fifo", "ddp", "pace"):
        result = evaluate("gpt3-1.3b", "dgx-a100x2", Plan(tp=8, dp=2, mb=8, global_batch=16,
                                                          dp_sched=sched))
        assert result.breakdown["dp"] == pytest.approx(last, rel=1e-9)
    hidden = evaluate("gpt3-1.3b", "dgx-a100x2", plan)
    exposed = evaluate("gpt3-1.3b", "dgx-a100x2", Plan(tp=8, dp=2, mb=8, global_batch=16,
                                                       overlap=False))
    assert exposed.breakdown["dp"] == pytest.approx(whole, rel=1e-9)
    assert exposed.step_time - hidden.step_time == pytest.approx(whole - last, rel=1e-9)
    with pytest.raises(CommflowError, match="dp_sched must be one of"):
        Plan(dp_sched="dear")


def test_switches_that_aggregate_let_data_parallel_use_ina():
    from commflow.plan.comm import cluster_links, collective_line
    from commflow.plan.evaluate import resolve_cluster

    topology = resolve_cluster("dgx-a100x8")
    plain, sharp = cluster_links(topology), cluster_links(topology, in_network=True)
    assert collective_line("allreduce", 1, 8, plain).algorithm != "ina"
    line = collective_line("allreduce", 1, 8, sharp)
    assert line.algorithm == "ina"
    assert 0.95 * sharp.network_bandwidth <= line.bandwidth <= sharp.network_bandwidth
    plan = Plan(tp=8, dp=8, mb=1, global_batch=64, overlap=False)
    ring = evaluate("gpt3-6.7b", "dgx-a100x8", plan)
    ina = evaluate("gpt3-6.7b", "dgx-a100x8", plan, in_network=True)
    assert ina.breakdown["dp"] < 0.65 * ring.breakdown["dp"]


def test_pipelined_tp_exposes_one_step_of_each_collective_per_pass():
    base = dict(tp=8, pp=8, dp=1, mb=1, global_batch=64, sp=True, recompute="selective")
    plain = evaluate("gpt3-175b", "dgx-a100x8", Plan(**base))
    piped = evaluate("gpt3-175b", "dgx-a100x8", Plan(**base, tp_overlap="pipelined"))
    # compute outlasts every collective here: each pass exposes 1/tp of its collectives
    assert piped.breakdown["tp"] == pytest.approx(plain.breakdown["tp"] / 8, rel=1e-12)
    assert piped.step_time < plain.step_time
    with pytest.raises(CommflowError, match="tp_overlap must be one of"):
        Plan(tp_overlap="flux")


def test_compressed_gradients_shrink_the_data_parallel_bytes():
    from commflow.compress import Codec, wire_fraction
    from commflow.plan.comm import cluster_links, collective_time
    from commflow.plan.evaluate import resolve_cluster
    from commflow.plan.memory import stage_params
    from commflow.plan.models import get_model

    assert wire_fraction("int8", 4) == Codec(name="int8").encoded_bytes(256) / 1024 == 260 / 1024
    assert wire_fraction("fp16", 2) == 1.0 and wire_fraction("none") == 1.0
    spec, links = get_model("gpt3-6.7b"), cluster_links(resolve_cluster("dgx-a100x8"))
    base = dict(tp=8, dp=8, mb=1, global_batch=64, overlap=False)
    grads = stage_params(spec, Plan(**base)) * 2
    for codec in ("none", "int8", "int4"):
        result = evaluate("gpt3-6.7b", "dgx-a100x8", Plan(**base, dp_codec=codec))
        wire = grads * wire_fraction(codec, 2)
        assert result.breakdown["dp"] == pytest.approx(
            collective_time("allreduce", wire, 8, 8, links), rel=1e-9)
    with pytest.raises(CommflowError, match="dp_codec must be one of"):
        Plan(dp_codec="int2")


def test_training_time_and_gpu_hours_for_a_token_budget():
    result = evaluate("gpt3-6.7b", "dgx-a100x4", SMALL)  # 32 sequences of 2048 per step
    run = result.training(1e9)
    steps = -(-1_000_000_000 // (32 * 2048))
    assert run["steps"] == steps == 15259
    assert run["train_time_s"] == pytest.approx(steps * result.step_time)
    assert run["train_days"] == pytest.approx(run["train_time_s"] / 86400)
    assert run["gpu_hours"] == pytest.approx(run["train_time_s"] * 32 / 3600)
    assert result.training(32 * 2048)["steps"] == 1
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(CommflowError, match="tokens to train"):
            result.training(bad)
