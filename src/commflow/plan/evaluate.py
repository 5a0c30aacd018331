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
from commflow.plan.comm import ClusterLinks, cluster_links, p2p_time
from commflow.plan.compute import Calibration, calibration_for, logits_time, model_flops
from commflow.plan.hardware import Accelerator, get_accelerator, implied_accelerator
from commflow.plan.hetero import StageDevice, boundary_links, partition_layers, stage_devices
from commflow.plan.memory import Memory, memory_per_gpu, stage_params
from commflow.plan.models import TransformerSpec, get_model
from commflow.plan.parallel import Plan, check_plan
from commflow.plan.pipeline import OpTimes, PipelineRun, formula_makespan, schedule_makespan
from commflow.plan.reduction import exposed_dp, exposed_gather
from commflow.plan.stagetime import WIRE_BYTES, PerMicrobatch, per_microbatch
from commflow.topology import Topology, load

OPTIMIZER_BYTES = 34
"""HBM bytes the Adam step reads and writes per (sharded) parameter (modelling choice)."""


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
    stage_layers: tuple[float, ...] = ()
    """Layers of each pipeline stage (``plan.partition``)."""
    stage_accelerators: tuple[str, ...] = ()
    """Accelerator of each pipeline stage (its boxes'; heterogeneous clusters differ)."""

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
            "stage_layers": list(self.stage_layers),
            "stage_accelerators": list(self.stage_accelerators),
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
        if (gpus is not None and topology.nranks != gpus and gpus % topology.nranks == 0
                and "+" not in cluster):
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


def _stage_layers(spec: TransformerSpec, plan: Plan, devices: tuple[StageDevice, ...],
                  cals: list[Calibration]) -> tuple[float, ...]:
    """Layers per stage: ``layers / pp`` each, or (``partition=balanced``) in proportion to each
    stage's speed per layer, the last stage's logits counted, within each stage's memory."""
    if plan.partition == "even":
        return (spec.layers / plan.pp,) * plan.pp
    base = memory_per_gpu(spec, plan, layers=0).total
    per_layer_bytes = memory_per_gpu(spec, plan, layers=1).total - base
    per_layer, fixed, capacity = [], [], []
    seconds: dict[int, float] = {}  # per StageDevice: stages on alike boxes share one
    for device, cal in zip(devices, cals, strict=True):
        if id(device) not in seconds:
            one = per_microbatch(spec, plan, device.accelerator, device.links, cal, layers=1)
            seconds[id(device)] = one.forward + one.backward + one.weight
        per_layer.append(seconds[id(device)])
        fixed.append(0.0)
        capacity.append(int((device.accelerator.hbm_bytes - base) // per_layer_bytes))
    logit = logits_time(spec, plan, devices[-1].accelerator, cals[-1])
    fixed[-1] = logit * (4 if plan.recompute == "full" else 3)  # forward, backward, weight
    return tuple(float(n) for n in partition_layers(spec.layers, per_layer, fixed, capacity))


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
    each candidate). ``gpu`` serves the boxes whose topology names no accelerator; each
    stage runs on its own boxes' accelerator and links (:mod:`commflow.plan.hetero`)."""
    check_plan(spec, plan, gpus=links.gpus, gpus_per_box=links.gpus_per_box)
    devices = stage_devices(links, plan, gpu)
    cals = [calibration or calibration_for(d.accelerator, plan.precision) for d in devices]
    layers = _stage_layers(spec, plan, devices, cals)
    keys = [(id(devices[s]), layers[s]) for s in range(plan.pp)]  # alike stages computed once
    per: dict[tuple[int, float], PerMicrobatch] = {}
    for key, device, cal, count in zip(keys, devices, cals, layers, strict=True):
        if key not in per:
            per[key] = per_microbatch(spec, plan, device.accelerator, device.links, cal,
                                      layers=count / plan.vp)
    mbs = [per[key] for key in keys]
    logit = logits_time(spec, plan, devices[-1].accelerator, cals[-1])
    forward = [[mb.forward] * plan.vp for mb in mbs]
    backward = [[mb.backward] * plan.vp for mb in mbs]
    weight = [[mb.weight] * plan.vp for mb in mbs]
    forward[-1][-1] += logit
    backward[-1][-1] += logit * (2 if plan.recompute == "full" else 1)
    weight[-1][-1] += logit
    width = WIRE_BYTES
    act = plan.mb * spec.seq / plan.cp * spec.hidden * width / (plan.tp if plan.sp else 1)
    stride = plan.tp * plan.cp * plan.dp
    p2p = max((p2p_time(act, stride, b) for b in boundary_links(links, plan)), default=0.0)
    times = OpTimes(forward, backward, weight)
    if pipeline == "formula":
        run = formula_makespan(plan.schedule, times, plan.microbatches, p2p)
    elif pipeline in ("simulate", "exact"):
        run = schedule_makespan(
            plan.schedule, times, plan.microbatches, p2p, exact=pipeline == "exact"
        )
    else:
        raise CommflowError(f"pipeline must be simulate, exact or formula, got {pipeline!r}")
    tails: dict[tuple[int, float], tuple[float, float, float]] = {}  # dp, optimizer, gather
    memories: dict[float, Memory] = {}
    for key, device, count, mb in zip(keys, devices, layers, mbs, strict=True):
        if key in tails:
            continue
        params = stage_params(spec, plan, layers=count)
        grads = params * width
        window = plan.vp * (mb.backward + mb.weight)
        forward_pass = plan.vp * mb.forward
        sharded = params / (plan.dp if plan.zero else 1)
        tails[key] = (
            exposed_dp(plan, grads, device.links, window, forward_pass, count),
            sharded * OPTIMIZER_BYTES / device.accelerator.hbm_bandwidth,
            exposed_gather(plan, grads, device.links, forward_pass),
        )
        memories.setdefault(count, memory_per_gpu(spec, plan, layers=count))
    ends = [end + tails[key][0] + tails[key][1] for end, key in zip(run.stage_time, keys,
                                                                    strict=True)]
    critical = max(range(plan.pp), key=ends.__getitem__)
    exposed, optimizer, gather = tails[keys[critical]]
    step = ends[critical] + cals[critical].step_overhead
    m = plan.microbatches
    breakdown = {name: m * value for name, value in mbs[critical].parts.items()}
    busy = run.stage_busy[critical]
    breakdown = {"compute": busy - sum(breakdown.values()), **breakdown}
    breakdown["pp_bubble"] = run.stage_time[critical] - busy
    breakdown["dp"] = exposed
    breakdown["optimizer"] = optimizer
    breakdown["overhead"] = cals[critical].step_overhead
    gpus = plan.gpus
    flops_model = model_flops(spec, plan.global_batch, recompute=False)
    load = [memories[n].total / d.accelerator.hbm_bytes for n, d in zip(layers, devices,
                                                                         strict=True)]
    fullest = max(range(plan.pp), key=load.__getitem__)
    peak = sum(d.accelerator.peak(plan.precision) for d in devices) / plan.pp
    return Evaluation(
        plan=plan,
        step_time=step,
        tokens_per_s=plan.global_batch * spec.seq / step,
        tflops_per_gpu_hw=_hw_flops(spec, plan) / (step * gpus) / 1e12,
        tflops_per_gpu_model=flops_model / (step * gpus) / 1e12,
        mfu=flops_model / (step * gpus * peak),
        memory=memories[layers[fullest]],
        fits=max(load) <= 1.0,
        breakdown=breakdown,
        pipeline=run,
        op_comm=mbs[critical].op_comm,
        p2p=p2p,
        exposed_dp=exposed,
        zero_gather=gather,
        stage_layers=layers,
        stage_accelerators=tuple(d.accelerator.name for d in devices),
    )
