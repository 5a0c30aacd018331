"""Evaluate one plan: step time, throughput, TFLOP/s, MFU, memory and where the time goes.

A step is the pipeline schedule (:mod:`commflow.plan.pipeline`) over per-micro-batch op times
built from compute (:mod:`commflow.plan.compute`) plus the exposed TP/SP, CP, EP and ZeRO-3
collectives (:mod:`commflow.plan.comm`, simulated), then each stage's data-parallel gradient
reduction (overlapped with its last backward pass when ``plan.overlap``), the optimizer step
(memory-bound) and a fixed overhead. Ranks are ordered TP fastest, then CP, DP, PP
(Megatron-LM's order), so TP stays in a box and DP/PP groups span boxes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from commflow.errors import CommflowError
from commflow.plan.comm import (
    ClusterLinks,
    cluster_links,
    collective_line,
    collective_time,
    group_shape,
    p2p_time,
)
from commflow.plan.compute import (
    Calibration,
    calibration_for,
    layer_times,
    logits_time,
    model_flops,
)
from commflow.plan.hardware import Accelerator, get_accelerator, implied_accelerator
from commflow.plan.memory import Memory, memory_per_gpu, stage_params
from commflow.plan.models import TransformerSpec, get_model
from commflow.plan.parallel import Plan, check_plan
from commflow.plan.pipeline import OpTimes, PipelineRun, formula_makespan, schedule_makespan
from commflow.topology import Topology, load

OPTIMIZER_BYTES = 34
"""HBM bytes the Adam step reads and writes per (sharded) parameter (modelling choice)."""

WIRE_BYTES = 2
"""Bytes per element of what travels between GPUs (activations, gradients, gathered weights):
16-bit in every precision, fp8 included (fp8 only feeds the GEMMs, as in Transformer
Engine)."""


@dataclass(frozen=True)
class Evaluation:
    """Predicted performance of one plan."""

    plan: Plan
    step_time: float
    """Seconds per training step."""
    tokens_per_s: float
    """Tokens trained per second, whole cluster."""
    tflops_per_gpu_hw: float
    """Hardware TFLOP/s per GPU (recompute counted)."""
    tflops_per_gpu_model: float
    """Model TFLOP/s per GPU (no recompute)."""
    mfu: float
    """Model FLOPs utilization: model FLOP/s over peak."""
    memory: Memory
    """Peak bytes per GPU."""
    fits: bool
    """Whether ``memory`` fits in the accelerator's HBM."""
    breakdown: dict[str, float]
    """Seconds per part on the critical stage; the parts sum to ``step_time``."""
    pipeline: PipelineRun
    """The simulated schedule (timeline)."""
    op_comm: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Exposed seconds of each collective (``tp``, ``cp``, ``ep``, ``zero3_gather``) inside
    one forward and one backward op of a model chunk (what the timeline draws as lanes)."""
    p2p: float = 0.0
    """Seconds of one pipeline send between neighbouring stages."""
    exposed_dp: float = 0.0
    """Seconds each stage's data-parallel gradient reduction runs after its last backward
    op, ZeRO-1/2's parameter all-gather (``zero_gather``) included."""
    zero_gather: float = 0.0
    """Exposed seconds of ZeRO-1/2's all-gather of the updated parameters (what the next
    step's first forward pass does not hide)."""

    def __repr__(self) -> str:
        """One line: the plan and its headline numbers, not the timeline (``pipeline`` holds
        every op of the step)."""
        return (
            f"Evaluation(plan={self.plan.describe()!r}, step_time={self.step_time:.6g}, "
            f"tokens_per_s={self.tokens_per_s:.6g}, mfu={self.mfu:.4f}, "
            f"memory_gib={self.memory.total / 2**30:.2f}, fits={self.fits}, "
            f"pipeline={self.pipeline!r})"
        )

    def training(self, tokens: float) -> dict[str, float]:
        """Training ``tokens`` tokens with this plan: whole steps (the last one full),
        seconds, days and GPU-hours. Raises ``CommflowError`` unless ``tokens`` is finite and
        > 0."""
        if isinstance(tokens, bool) or not 0 < tokens < math.inf:
            raise CommflowError(f"tokens to train must be a number > 0, got {tokens!r}")
        per_step = round(self.tokens_per_s * self.step_time)  # global batch x sequence
        steps = math.ceil(tokens / per_step)
        seconds = steps * self.step_time
        return {
            "train_tokens": tokens,
            "steps": steps,
            "train_time_s": seconds,
            "train_days": seconds / 86400,
            "gpu_hours": seconds * self.plan.gpus / 3600,
        }

    def to_dict(self, train_tokens: float | None = None) -> dict:
        """The ``--json`` record; with ``train_tokens``, also :meth:`training`'s fields."""
        record = {
            "plan": self.plan.describe(),
            "step_time_s": self.step_time,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu_hw": self.tflops_per_gpu_hw,
            "tflops_per_gpu_model": self.tflops_per_gpu_model,
            "mfu": self.mfu,
            "memory_per_gpu_gib": self.memory.to_dict()["total"],
            "memory_gib": self.memory.to_dict(),
            "fits": self.fits,
            "breakdown": dict(self.breakdown),
        }
        if train_tokens is not None:
            record.update(self.training(train_tokens))
        return record


def accelerator_for(accelerator: Accelerator | str | None,
                    cluster: Topology | str) -> Accelerator:
    """``accelerator`` itself, a preset by name, or (``None``) the one ``cluster`` implies."""
    if isinstance(accelerator, Accelerator):
        return accelerator
    if accelerator is None:
        name = cluster if isinstance(cluster, str) else cluster.name
        accelerator = implied_accelerator(name)
    return get_accelerator(accelerator)


def resolve_cluster(cluster: Topology | str, gpus: int | None = None) -> Topology:
    """A topology from a preset or file name; ``gpus`` picks the box count of a multi-box
    preset written without one (``dgx-a100`` with 64 GPUs is ``dgx-a100x8``)."""
    if isinstance(cluster, Topology):
        topology = cluster
    else:
        topology = load(cluster)
        if gpus is not None and topology.nranks != gpus and gpus % topology.nranks == 0:
            topology = load(f"{cluster}x{gpus // topology.nranks}")
    if gpus is not None and topology.nranks != gpus:
        raise CommflowError(
            f"cluster {topology.name} has {topology.nranks} GPUs, not {gpus}; name a preset "
            "without a box count (dgx-a100) or one with the right count"
        )
    return topology


def _hw_flops(model: TransformerSpec, plan: Plan) -> float:
    if plan.recompute == "full":
        return model_flops(model, plan.global_batch, recompute=True)
    base = model_flops(model, plan.global_batch, recompute=False)
    if plan.recompute == "selective":
        base += plan.global_batch * model.layers * 4 * model.seq**2 * model.hidden
    return base


@dataclass(frozen=True)
class _PerMicrobatch:
    """Seconds per micro-batch on one stage, per model chunk (all chunks alike)."""

    forward: float
    backward: float
    weight: float
    parts: dict[str, float]  # exposed tp/cp/ep/zero3 seconds per micro-batch, all chunks
    op_comm: dict[str, tuple[float, float]]  # the same per forward / backward op of a chunk


def _per_microbatch(
    model: TransformerSpec, plan: Plan, gpu: Accelerator, links: ClusterLinks, cal: Calibration
) -> _PerMicrobatch:
    lt = layer_times(model, plan, gpu, cal)
    width = WIRE_BYTES
    act = plan.mb * model.seq / plan.cp * model.hidden * width
    if plan.sp:
        tp = 2 * (
            collective_time("allgather", act, plan.tp, 1, links)
            + collective_time("reducescatter", act, plan.tp, 1, links)
        )
    else:
        tp = 2 * collective_time("allreduce", act, plan.tp, 1, links)
    kv = plan.mb * model.seq * model.kv_width * width
    cp = collective_time("allgather", kv / plan.tp, plan.cp, plan.tp, links)
    ep = 0.0
    if model.experts > 1:
        share = model.moe_layers / model.layers  # per layer, averaged over dense layers
        ep = share * 2 * collective_time(
            "alltoall", act * model.top_k / plan.tp, plan.ep, plan.tp * plan.cp, links
        )
    layers = model.layers / (plan.pp * plan.vp)
    passes = 3 if plan.recompute == "full" else 2  # forward, backward, recomputed forward
    gather = 0.0
    if plan.zero == 3:  # each pass gathers the stage's parameters: allgather of their bytes
        stage_bytes = layers * model.layer_params / plan.tp * width
        gather = collective_time("allgather", stage_bytes, plan.dp, plan.tp * plan.cp, links)
    fwd_compute = layers * lt.forward
    bwd_compute = layers * (lt.backward_input + lt.recompute)
    fwd_gather = max(0.0, gather - fwd_compute) if plan.overlap else gather
    bwd_gather = max(0.0, gather - bwd_compute) if plan.overlap else gather
    tp_fwd, tp_bwd = _exposed_tp(tp, plan, lt.forward, lt.backward_input + lt.recompute)
    forward = fwd_compute + layers * (tp_fwd + cp + ep) + fwd_gather
    backward = bwd_compute + layers * (tp_bwd + (cp + ep) * (passes - 1)) + bwd_gather
    parts = {name: plan.vp * layers * passes * t for name, t in (("cp", cp), ("ep", ep))}
    parts = {"tp": plan.vp * layers * (tp_fwd + tp_bwd), **parts}
    parts["zero3_gather"] = plan.vp * (fwd_gather + bwd_gather)
    op_comm = {
        name: (layers * t, layers * t * (passes - 1)) for name, t in (("tp", tp), ("cp", cp),
                                                                    ("ep", ep))
    }
    op_comm["zero3_gather"] = (fwd_gather, bwd_gather)
    return _PerMicrobatch(forward, backward, layers * lt.backward_weight, parts, op_comm)


def _exposed_tp(tp: float, plan: Plan, forward: float, backward: float) -> tuple[float, float]:
    """Exposed TP/SP seconds per layer in the forward pass and in the backward passes (with
    recompute's extra forward), ``tp`` being one pass's collectives.

    ``pipelined``: each collective is cut into ``plan.tp`` steps, each overlapped with the
    GEMM slice that uses (or produces) the previous one, so a pass exposes its first step
    (``tp / plan.tp``) and whatever communication outlasts the pass's compute.
    """
    passes = 3 if plan.recompute == "full" else 2
    if plan.tp_overlap == "none" or tp <= 0:
        return tp, tp * (passes - 1)
    first = tp / plan.tp
    fwd = max(first, tp - forward)
    bwd = max(first * (passes - 1), tp * (passes - 1) - backward)
    return fwd, bwd


def evaluate(
    model: TransformerSpec | str,
    cluster: Topology | str,
    plan: Plan,
    *,
    accelerator: Accelerator | str | None = None,
    calibration: Calibration | None = None,
    pipeline: str = "simulate",
    in_network: bool = False,
) -> Evaluation:
    """Predict one training step of ``model`` on ``cluster`` under ``plan``.

    ``pipeline`` picks how the schedule is timed: ``"simulate"`` (event-driven, steady state
    extrapolated, :func:`~commflow.plan.pipeline.schedule_makespan`), ``"exact"`` (every
    micro-batch simulated) or ``"formula"`` (closed-form bubble, for screening).
    ``accelerator`` defaults to the one the cluster preset implies (``dgx-h100``: H100). Raises
    ``CommflowError`` when the plan does not divide the model or cluster, or names are unknown.
    ``in_network``: the cluster's switches aggregate (SHARP), so allreduce may use ``ina``.
    ``calibration`` defaults to the accelerator's and precision's
    (:func:`~commflow.plan.compute.calibration_for`).
    """
    spec = model if isinstance(model, TransformerSpec) else get_model(model)
    gpu = accelerator_for(accelerator, cluster)
    links = cluster_links(resolve_cluster(cluster, plan.gpus), in_network=in_network)
    return evaluate_on_links(spec, links, plan, gpu, calibration=calibration, pipeline=pipeline)


def _zero_gather(plan: Plan, grads: float, links: ClusterLinks) -> float:
    """Seconds of ZeRO-1/2's all-gather of the updated parameters over the DP group."""
    if plan.zero in (1, 2):
        return collective_time("allgather", grads, plan.dp, plan.tp * plan.cp, links)
    return 0.0


def _exposed_gather(plan: Plan, grads: float, links: ClusterLinks, forward: float) -> float:
    """Seconds of ZeRO-1/2's parameter all-gather left after ``forward`` seconds of the next
    step's first forward pass (all of it without ``plan.overlap``)."""
    gather = _zero_gather(plan, grads, links)
    return max(0.0, gather - forward) if plan.overlap else gather


def _replica_collective(kind: str, size: float, plan: Plan, links: ClusterLinks) -> float:
    """Seconds of the gradient reduction ``kind`` of ``size`` bytes over a stage's replicas:
    the ``dp`` ranks of its data-parallel group, and for Chimera also the ``dp`` ranks that
    hold the same stage in the other pipeline (``2·dp``; counted in other boxes when a
    stage's ``tp·cp·dp`` ranks fill a box, else in the same box)."""
    stride = plan.tp * plan.cp
    if plan.schedule != "chimera":
        return collective_time(kind, size, plan.dp, stride, links)
    per_box, boxes = group_shape(plan.dp, stride, links.gpus_per_box)
    if stride * plan.dp >= links.gpus_per_box:
        boxes *= 2
    else:
        per_box *= 2
    return collective_line(kind, per_box, boxes, links).time(size)


def _exposed_dp(spec: TransformerSpec, plan: Plan, grads: float, links: ClusterLinks,
                window: float, forward: float) -> float:
    """Seconds a stage's data-parallel gradient reduction adds after its last backward pass.

    The reduction (allreduce; reduce-scatter under ZeRO) of the last backward pass's
    gradients, layer by layer as backward produces them (``window`` seconds for the stage's
    layers, evenly), is scheduled by ``plan.dp_sched`` (:func:`commflow.sched.drain`, with
    the message cost fitted to the simulated collective at one layer's and at all the
    stage's gradient bytes); without ``plan.overlap`` it all follows backward. ZeRO-1/2's
    all-gather of the updated parameters follows the optimizer step; with ``plan.overlap`` it
    hides behind the next step's first forward pass (``forward`` seconds), bucket by bucket,
    as Megatron-Core's ``overlap_param_gather`` does.
    ``plan.dp_codec`` scales the gradient bytes on the wire
    (:func:`commflow.compress.wire_fraction`), not the parameters' all-gather.
    """
    from commflow.compress import wire_fraction
    from commflow.sched import Workload, drain, fitted_cost

    gather = _exposed_gather(plan, grads, links, forward)
    grads *= wire_fraction(plan.dp_codec, WIRE_BYTES)
    kind = "allreduce" if plan.zero == 0 else "reducescatter"
    reduce = _replica_collective(kind, grads, plan, links)
    layers = spec.layers // (plan.pp * plan.vp) * plan.vp
    if not plan.overlap or reduce <= 0 or layers == 1:  # one layer: ready when backward ends
        return reduce + gather
    piece = grads / layers
    cost = fitted_cost({piece: _replica_collective(kind, piece, plan, links),
                        grads: reduce}, name=f"{kind} over dp={plan.dp}")
    backward = Workload.from_lists("stage", [0.0] * layers, [window / layers] * layers,
                                   [piece] * layers)
    return drain(backward, plan.dp_sched, cost) + gather


def evaluate_on_links(
    spec: TransformerSpec,
    links: ClusterLinks,
    plan: Plan,
    gpu: Accelerator,
    *,
    calibration: Calibration | None = None,
    pipeline: str = "simulate",
) -> Evaluation:
    """:func:`evaluate` on a cluster already summarized by
    :func:`~commflow.plan.comm.cluster_links` (what :func:`~commflow.plan.search` calls for
    each candidate)."""
    check_plan(spec, plan, gpus=links.gpus, gpus_per_box=links.gpus_per_box)
    if calibration is None:
        calibration = calibration_for(gpu, plan.precision)
    mb = _per_microbatch(spec, plan, gpu, links, calibration)
    logit = logits_time(spec, plan, gpu, calibration)
    forward = [[mb.forward] * plan.vp for _ in range(plan.pp)]
    backward = [[mb.backward] * plan.vp for _ in range(plan.pp)]
    weight = [[mb.weight] * plan.vp for _ in range(plan.pp)]
    forward[-1][-1] += logit
    backward[-1][-1] += logit * (2 if plan.recompute == "full" else 1)
    weight[-1][-1] += logit
    width = WIRE_BYTES
    act = plan.mb * spec.seq / plan.cp * spec.hidden * width / (plan.tp if plan.sp else 1)
    p2p = p2p_time(act, plan.tp * plan.cp * plan.dp, links) if plan.pp > 1 else 0.0
    times = OpTimes(forward, backward, weight)
    if pipeline == "formula":
        run = formula_makespan(plan.schedule, times, plan.microbatches, p2p)
    elif pipeline in ("simulate", "exact"):
        run = schedule_makespan(
            plan.schedule, times, plan.microbatches, p2p, exact=pipeline == "exact"
        )
    else:
        raise CommflowError(f"pipeline must be simulate, exact or formula, got {pipeline!r}")
    params = stage_params(spec, plan)
    grads = params * width
    window = plan.vp * (mb.backward + mb.weight)
    exposed = _exposed_dp(spec, plan, grads, links, window, plan.vp * mb.forward)
    ends = [end + exposed for end in run.stage_time]
    critical = max(range(plan.pp), key=ends.__getitem__)
    sharded = params / (plan.dp if plan.zero else 1)
    optimizer = sharded * OPTIMIZER_BYTES / gpu.hbm_bandwidth
    step = ends[critical] + optimizer + calibration.step_overhead
    m = plan.microbatches
    breakdown = {name: m * value for name, value in mb.parts.items()}
    busy = run.stage_busy[critical]
    breakdown = {"compute": busy - sum(breakdown.values()), **breakdown}
    breakdown["pp_bubble"] = run.stage_time[critical] - busy
    breakdown["dp"] = ends[critical] - run.stage_time[critical]
    breakdown["optimizer"] = optimizer
    breakdown["overhead"] = calibration.step_overhead
    gpus = plan.gpus
    flops_model = model_flops(spec, plan.global_batch, recompute=False)
    memory = memory_per_gpu(spec, plan)
    return Evaluation(
        plan=plan,
        step_time=step,
        tokens_per_s=plan.global_batch * spec.seq / step,
        tflops_per_gpu_hw=_hw_flops(spec, plan) / (step * gpus) / 1e12,
        tflops_per_gpu_model=flops_model / (step * gpus) / 1e12,
        mfu=flops_model / (step * gpus * gpu.peak(plan.precision)),
        memory=memory,
        fits=memory.total <= gpu.hbm_bytes,
        breakdown=breakdown,
        pipeline=run,
        op_comm=mb.op_comm,
        p2p=p2p,
        exposed_dp=exposed,
        zero_gather=_exposed_gather(plan, grads, links, plan.vp * mb.forward),
    )
