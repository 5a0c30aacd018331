"""Search the plans of a model on a cluster: enumerate the valid ones (divisibility, memory),
screen them with the closed-form pipeline bubble, then rank the best by the event-driven
pipeline simulation.

Screening evaluates every candidate with :func:`~commflow.plan.pipeline.formula_makespan`
(milliseconds each); the best ``screen_factor * top`` are re-evaluated with the simulated
schedule and the final order comes from those. Collective times are simulated once per group
shape and cached (:mod:`commflow.plan.comm`), so the whole search costs seconds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product

from commflow.errors import CommflowError
from commflow.plan.comm import ClusterLinks, cluster_links
from commflow.plan.compute import Calibration
from commflow.plan.evaluate import (
    Evaluation,
    accelerator_for,
    evaluate_on_links,
    resolve_cluster,
)
from commflow.plan.hardware import Accelerator, get_accelerator
from commflow.plan.memory import memory_per_gpu
from commflow.plan.models import TransformerSpec, get_model
from commflow.plan.parallel import Plan, check_plan
from commflow.topology import Topology

CP_MIN_SEQ = 8192
"""Shortest sequence for which the search tries context parallelism."""


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The choices :func:`search` enumerates (TP: divisors of a box; PP: divisors of the
    layers; DP: the rest)."""

    micro_batches: Sequence[int] = (1, 2, 4, 8)
    """Micro-batch sizes."""
    virtual_stages: Sequence[int] = (2, 3, 4)
    """Chunks per stage tried with the interleaved schedule (besides plain 1F1B)."""
    schedules: Sequence[str] = ("1f1b", "interleaved", "zb-h1", "zb-h2", "chimera")
    """Pipeline schedules (``interleaved`` uses ``virtual_stages``; ``chimera`` only with an
    even ``pp`` and micro-batches a multiple of it; ``gpipe`` may be added)."""
    recompute: Sequence[str] = ("none", "selective", "full")
    """Activation recompute modes."""
    zero: Sequence[int] = (0, 1, 2, 3)
    """ZeRO stages."""
    context_parallel: Sequence[int] | None = None
    """Context-parallel sizes; ``None``: 1, and when the sequence is at least
    :data:`CP_MIN_SEQ` the powers of two up to ``max_context_parallel`` dividing it."""
    max_context_parallel: int = 16
    """Largest context-parallel size the default tries."""
    expert_parallel: Sequence[int] | None = None
    """Expert-parallel sizes; ``None``: every divisor of a MoE model's expert count (1 for a
    dense model). Each must also divide the data-parallel size."""
    partitions: Sequence[str] | None = None
    """Layer partitions (``even``, ``balanced``); ``None``: both on a heterogeneous cluster,
    ``even`` on others."""

    def cp_sizes(self, model: TransformerSpec) -> list[int]:
        """The context-parallel sizes tried for ``model``."""
        if self.context_parallel is not None:
            return list(self.context_parallel)
        sizes, cp = [1], 2
        while model.seq >= CP_MIN_SEQ and cp <= self.max_context_parallel and model.seq % cp == 0:
            sizes.append(cp)
            cp *= 2
        return sizes

    def ep_sizes(self, model: TransformerSpec) -> list[int]:
        """The expert-parallel sizes tried for ``model``."""
        if self.expert_parallel is not None:
            return list(self.expert_parallel)
        return _divisors(model.experts)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _shapes(space: SearchSpace, pp: int) -> list[tuple[str, int]]:
    """``(schedule, vp)`` pairs for ``pp`` stages (one stage: plain 1F1B only)."""
    shapes = [("1f1b", 1)] if "1f1b" in space.schedules or pp == 1 else []
    if pp > 1:
        shapes += [(s, 1) for s in space.schedules
                   if s in ("gpipe", "zb-h1", "zb-h2") or s == "chimera" and pp % 2 == 0]
        if "interleaved" in space.schedules:
            shapes += [("interleaved", v) for v in space.virtual_stages]
    return shapes


def candidates(
    model: TransformerSpec,
    gpus: int,
    gpus_per_box: int,
    global_batch: int,
    precision: str,
    space: SearchSpace,
    *,
    heterogeneous: bool = False,
) -> Iterator[Plan]:
    """Every plan of ``space`` that divides ``model`` and the cluster (memory not checked);
    ``heterogeneous``: the cluster's boxes differ (the default partitions then include
    ``balanced``)."""
    eps = space.ep_sizes(model)
    partitions = space.partitions or (("even", "balanced") if heterogeneous else ("even",))
    for tp, cp, pp in product(_divisors(gpus_per_box), space.cp_sizes(model),
                              _divisors(model.layers)):
        if gpus % (tp * cp * pp):
            continue
        dp = gpus // (tp * cp * pp)
        for mb in space.micro_batches:
            if global_batch % (dp * mb):
                continue
            for ep, (schedule, vp), recompute, zero, partition in product(
                [e for e in eps if dp % e == 0], _shapes(space, pp), space.recompute,
                space.zero, [p for p in partitions if pp > 1 or p == "even"],
            ):
                try:
                    plan = Plan(
                        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=tp > 1, mb=mb,
                        global_batch=global_batch, vp=vp, zero=zero, recompute=recompute,
                        schedule=schedule, precision=precision, partition=partition,
                    )
                    check_plan(model, plan, gpus=gpus, gpus_per_box=gpus_per_box)
                except CommflowError:
                    continue
                yield plan


def _hbm(name: str | None, default: Accelerator) -> float:
    return get_accelerator(name).hbm_bytes if name else default.hbm_bytes


def _screen(spec: TransformerSpec, links: ClusterLinks, plan: Plan, gpu: Accelerator,
            calibration: Calibration | None) -> Evaluation | None:
    """The closed-form evaluation of ``plan``; ``None`` for a balanced partition whose
    stages cannot hold the layers."""
    try:
        return evaluate_on_links(spec, links, plan, gpu, calibration=calibration,
                                 pipeline="formula")
    except CommflowError:
        if plan.partition == "balanced":
            return None
        raise


def search(
    model: TransformerSpec | str,
    cluster: Topology | str,
    *,
    gpus: int | None = None,
    global_batch: int,
    accelerator: Accelerator | str | None = None,
    precision: str = "bf16",
    top: int = 10,
    space: SearchSpace = SearchSpace(),
    screen_factor: int = 2,
    calibration: Calibration | None = None,
    in_network: bool = False,
) -> list[Evaluation]:
    """The ``top`` fastest plans that fit in memory, fastest first.

    ``cluster`` is a topology or a preset name (``gpus`` sets its box count);
    ``accelerator`` defaults to the one the cluster preset implies
    (:func:`~commflow.plan.hardware.implied_accelerator`); ``in_network``: the cluster's
    switches aggregate (SHARP), so allreduce may use ``ina``; ``calibration`` defaults to the
    accelerator's and precision's. Raises
    ``CommflowError`` when no plan is valid and fits, naming the closest miss.
    """
    spec = model if isinstance(model, TransformerSpec) else get_model(model)
    gpu = accelerator_for(accelerator, cluster)
    topology = resolve_cluster(cluster, gpus)
    links = cluster_links(topology, in_network=in_network)
    fitting: list[Plan] = []
    smallest: float | None = None
    hbm = max(_hbm(box.accelerator, gpu) for box in set(links.boxes)) if links.heterogeneous \
        else gpu.hbm_bytes  # the largest box's: stages are checked one by one below
    for plan in candidates(
        spec, topology.nranks, links.gpus_per_box, global_batch, precision, space,
        heterogeneous=links.heterogeneous,
    ):
        need = memory_per_gpu(spec, plan).total
        if need <= hbm:
            fitting.append(plan)
        elif smallest is None or need < smallest:
            smallest = need
    if not fitting:
        detail = f"; the smallest needs {smallest / 2**30:.1f} GiB" if smallest else ""
        raise CommflowError(
            f"no valid plan of {spec.name} fits {topology.nranks} x {gpu.name} with global batch "
            f"{global_batch}{detail}: add GPUs, raise ZeRO, or change the batch"
        )
    screened = sorted(
        (e for e in (_screen(spec, links, p, gpu, calibration) for p in fitting)
         if e is not None and e.fits),
        key=lambda e: e.step_time,
    )
    if not screened:
        raise CommflowError(
            f"no valid plan of {spec.name} fits every stage's memory on {topology.name} with "
            f"global batch {global_batch}: add GPUs, raise ZeRO, or change the batch")
    finalists = [e.plan for e in screened[: max(top, 1) * screen_factor]]
    ranked = sorted(
        (evaluate_on_links(spec, links, p, gpu, calibration=calibration) for p in finalists),
        key=lambda e: e.step_time,
    )
    return ranked[:top]
