"""Compute time of one transformer layer on one GPU: FLOPs and bytes per op (GEMMs,
attention, elementwise), a roofline, and efficiency curves calibrated per accelerator and
precision.

A GEMM of ``f`` FLOPs runs at ``peak * e_max * f / (f + f_half)`` (small GEMMs fill the GPU
poorly); a MoE layer's routed experts run as one grouped GEMM, and moving the routed tokens
(router, permutation, combine) costs ``moe_passes`` HBM passes over them; the attention core
(``QK^T``, ``AV``) runs at ``attention_efficiency`` times a GEMM of its FLOPs at the 16-bit
peak (attention kernels do not run in fp8); elementwise ops (norms, softmax, dropout, GeLU,
residuals) move ``elementwise_passes`` times the 16-bit activation bytes of Korthikanti et al.
(2022) through HBM. Constants: :data:`CALIBRATIONS` (docs/planner.md, "Validation").
"""

from __future__ import annotations

from dataclasses import dataclass

from commflow.plan.hardware import Accelerator
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
    moe_passes: float = 2.0
    """HBM passes over the routed tokens' 16-bit hidden vectors (``top_k`` per token) in a MoE
    layer's forward pass: router, permutation, unpermutation and combine (backward twice)."""
    flash_attention: bool = False
    """Fused attention kernels (FlashAttention-2/3, cuDNN): the ``5as/h`` score bytes never
    reach HBM and the causal mask skips half of ``QK^T`` and ``AV``. ``False``: the scores are
    materialized and masked after a full product (Megatron-LM 2021)."""


CALIBRATION = Calibration(
    gemm_efficiency=0.71,
    gemm_half_flops=2e10,
    attention_efficiency=0.4,
    elementwise_passes=1.5,
    step_overhead=0.05,
)
"""Constants fitted on Megatron-LM SC'21 Table 1 (A100, fp16, Megatron 2021); the default for
accelerators and precisions without a calibration of their own."""

def _fitted(e_max: float, half: float, attention: float, passes: float,
            moe: float) -> Calibration:
    return Calibration(gemm_efficiency=e_max, gemm_half_flops=half, attention_efficiency=attention,
                       elementwise_passes=passes, step_overhead=0.05, moe_passes=moe,
                       flash_attention=True)


CALIBRATIONS: dict[tuple[str, str], Calibration] = {
    ("a100", "fp16"): CALIBRATION,
    ("a100", "bf16"): _fitted(0.750, 8.14e9, 0.417, 7.25, 2.0),
    ("a100-40gb", "bf16"): _fitted(0.601, 3.76e10, 0.238, 2.06, 2.0),
    ("h100", "bf16"): _fitted(0.636, 3.49e10, 0.614, 0.25, 17.9),
    ("h100", "fp8"): _fitted(0.548, 4.32e10, 0.880, 3.09, 95.7),
}
"""Constants per (accelerator family, precision), fitted on the ``fit`` rows of the published
runs (:mod:`commflow.plan.validation`; ``benchmarks/plan_validation.py --fit``)."""

_FAMILIES = (("a100-40gb", "a100-40gb"), ("a100", "a100"), ("h100", "h100"), ("h200", "h100"))
"""Accelerator name prefixes and the calibration family they share (H200: H100's chip; the
40 GB A100, with HBM2 and other runs, has its own)."""


def calibration_for(gpu: Accelerator, precision: str) -> Calibration:
    """The constants of ``gpu`` in ``precision`` (:data:`CALIBRATIONS`), else
    :data:`CALIBRATION`."""
    family = next((f for prefix, f in _FAMILIES if gpu.name.startswith(prefix)), gpu.name)
    return CALIBRATIONS.get((family, precision), CALIBRATION)


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


def attention_peak(gpu: Accelerator, plan: Plan) -> float:
    """Peak FLOP/s the attention core runs against: the 16-bit one (fp8 training keeps
    attention in bf16, as Transformer Engine does)."""
    return gpu.peak("bf16" if plan.precision == "fp8" else plan.precision)


def layer_times(
    model: TransformerSpec, plan: Plan, gpu: Accelerator, cal: Calibration = CALIBRATION
) -> LayerTimes:
    """Compute time of one layer (no communication) for one micro-batch on one GPU."""
    peak = gpu.peak(plan.precision)
    gemms = sum(gemm_time(f, peak, cal) for f in layer_gemm_flops(model, plan))
    causal = 0.5 if cal.flash_attention else 1.0
    attn = gemm_time(causal * attention_flops(model, plan), attention_peak(gpu, plan) *
                     cal.attention_efficiency, cal)
    linear, scores = activation_bytes(model, plan)
    if cal.flash_attention:
        scores = 0.0
    bandwidth = gpu.hbm_bandwidth / cal.elementwise_passes
    elem_linear, elem_scores = linear / bandwidth, scores / bandwidth
    if model.experts > 1:  # router, permute, unpermute, combine: top_k copies of each token
        routed = plan.mb * model.seq / plan.cp * model.top_k * model.hidden * 2
        share = model.moe_layers / model.layers
        elem_linear += share * cal.moe_passes * routed / gpu.hbm_bandwidth
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
