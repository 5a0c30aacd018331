"""Compute time of one transformer layer on one GPU: FLOPs and bytes per op (GEMMs,
attention, elementwise), a roofline, and an efficiency curve calibrated once.

A GEMM of ``f`` FLOPs runs at ``peak * e_max * f / (f + f_half)`` (small GEMMs fill the GPU
poorly); the attention core (``QK^T``, ``AV``) at ``attention_efficiency`` times that;
elementwise ops (norms, softmax, dropout, GeLU, residuals) move ``elementwise_passes`` times
the activation bytes of Korthikanti et al. (2022) through HBM. Each op takes the longer of its
FLOP time and its byte time (roofline). Constants: :data:`CALIBRATION`, fitted once on
Megatron-LM SC'21 Table 1 (docs/planner.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from commflow.plan.hardware import PRECISION_BYTES, Accelerator
from commflow.plan.models import TransformerSpec
from commflow.plan.parallel import Plan


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The planner's fitted constants (one set for every model, plan and accelerator)."""

    gemm_efficiency: float
    """Asymptotic fraction of peak FLOP/s a large GEMM reaches."""
    gemm_half_flops: float
    """GEMM size (FLOPs) at which it reaches half of ``gemm_efficiency``."""
    attention_efficiency: float
    """Efficiency of the attention core relative to a GEMM of the same FLOPs."""
    elementwise_passes: float
    """HBM traffic of elementwise ops, in multiples of the stored activation bytes."""
    step_overhead: float
    """Fixed per-step time (optimizer launch, data loading, logging), seconds."""


CALIBRATION = Calibration(
    gemm_efficiency=0.71,
    gemm_half_flops=2e10,
    attention_efficiency=0.4,
    elementwise_passes=1.5,
    step_overhead=0.05,
)
"""Constants fitted on Megatron-LM SC'21 Table 1 (A100); kept fixed everywhere else."""


@dataclass(frozen=True)
class LayerTimes:
    """Seconds one GPU spends on one layer for one micro-batch."""

    forward: float
    """Forward pass."""
    backward_input: float
    """Backward pass to the layer input (the "B" of zero-bubble schedules)."""
    backward_weight: float
    """Weight gradients (the "W" of zero-bubble schedules)."""
    recompute: float
    """Extra forward work the recompute mode re-runs in the backward pass."""

    @property
    def backward(self) -> float:
        """Whole backward pass including recompute, seconds."""
        return self.backward_input + self.backward_weight + self.recompute


def gemm_time(flops: float, peak: float, cal: Calibration = CALIBRATION) -> float:
    """Seconds for a GEMM of ``flops`` FLOPs on a GPU of ``peak`` FLOP/s."""
    if flops <= 0:
        return 0.0
    return (flops + cal.gemm_half_flops) / (peak * cal.gemm_efficiency)


def layer_gemm_flops(model: TransformerSpec, plan: Plan) -> list[float]:
    """Forward FLOPs of each weight GEMM of one layer on one GPU for one micro-batch (the
    MLP's width averaged over dense and MoE layers: routed ``top_k`` plus shared experts)."""
    tokens = plan.mb * model.seq / plan.cp
    h, t = model.hidden, plan.tp
    mlp = 2 * tokens * h * model.active_ffn / t
    attention = [2 * tokens * rows * cols / t for rows, cols in model.attention_matrices]
    return attention + [mlp] * model.mlp_matrices


def attention_flops(model: TransformerSpec, plan: Plan) -> float:
    """Forward FLOPs of ``QK^T`` and ``AV`` of one layer on one GPU for one micro-batch."""
    return 4 * plan.mb * model.seq * (model.seq / plan.cp) * model.attention_width / plan.tp


def activation_bytes(model: TransformerSpec, plan: Plan) -> tuple[float, float]:
    """Korthikanti et al. activation bytes of one layer for one micro-batch on one GPU, split
    into (linear-layer part, attention-score part ``5as/h``), in 16-bit precision."""
    sbh = model.seq / plan.cp * plan.mb * model.hidden
    linear = sbh * 34 / plan.tp if plan.sp else sbh * (10 + 24 / plan.tp)
    scores = sbh * 5 * model.heads * model.seq / (model.hidden * plan.tp)
    return linear, scores


def layer_times(
    model: TransformerSpec, plan: Plan, gpu: Accelerator, cal: Calibration = CALIBRATION
) -> LayerTimes:
    """Compute time of one layer (no communication) for one micro-batch on one GPU."""
    peak = gpu.peak(plan.precision)
    scale = PRECISION_BYTES[plan.precision] / 2
    gemms = sum(gemm_time(f, peak, cal) for f in layer_gemm_flops(model, plan))
    attn = gemm_time(attention_flops(model, plan), peak * cal.attention_efficiency, cal)
    linear, scores = activation_bytes(model, plan)
    bandwidth = gpu.hbm_bandwidth / cal.elementwise_passes
    elem_linear, elem_scores = linear * scale / bandwidth, scores * scale / bandwidth
    forward = gemms + attn + elem_linear + elem_scores
    recompute = {"none": 0.0, "selective": attn + elem_scores, "full": forward}[plan.recompute]
    return LayerTimes(
        forward=forward,
        backward_input=gemms + 2 * attn + 2 * (elem_linear + elem_scores),
        backward_weight=gemms,
        recompute=recompute,
    )


def logits_time(
    model: TransformerSpec, plan: Plan, gpu: Accelerator, cal: Calibration = CALIBRATION
) -> float:
    """Forward seconds of the output (logit) GEMM for one micro-batch on the last stage."""
    flops = 2 * plan.mb * model.seq / plan.cp * model.hidden * model.vocab / plan.tp
    return gemm_time(flops, gpu.peak(plan.precision), cal)


def model_flops(model: TransformerSpec, tokens_batch: int, *, recompute: bool) -> float:
    """Training FLOPs per step of ``tokens_batch`` sequences (Megatron SC'21): with full
    recompute ``96Bslh²(1 + s/6h + V/16lh)``, without ``72Bslh²(1 + s/6h + V/12lh)``;
    generalized to GQA, gated and MoE MLPs by counting the layer's GEMMs."""
    s, h, layer_count, v = model.seq, model.hidden, model.layers, model.vocab
    dense = Plan()
    gemm = sum(layer_gemm_flops(model, dense)) / s  # per token, forward
    attn = attention_flops(model, dense) / s
    per_token_fwd = layer_count * (gemm + attn)
    logits = 2 * h * v
    passes = 4 if recompute else 3
    return tokens_batch * s * (passes * per_token_fwd + 3 * logits)
