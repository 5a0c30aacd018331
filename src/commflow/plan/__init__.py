"""Parallel training planner: predict step time, throughput, TFLOP/s, MFU and memory of a
transformer trained with TP/PP/DP/CP/EP, ZeRO, recompute and a pipeline schedule on a
modelled cluster, and search for the best plan.

Communication is simulated with commflow's collective algorithms on the cluster's topology
(:mod:`commflow.plan.comm`); compute follows a roofline with one calibrated efficiency curve
(:mod:`commflow.plan.compute`); the pipeline is an event-driven schedule simulation
(:mod:`commflow.plan.pipeline`); :mod:`commflow.plan.validation` compares it with published
training runs. See docs/planner.md.

>>> from commflow.plan import Plan, evaluate
>>> plan = Plan(tp=8, pp=1, dp=2, mb=1, global_batch=16, sp=True, recompute="selective")
>>> result = evaluate("gpt3-6.7b", "dgx-a100x2", plan)
>>> result.fits, round(sum(result.breakdown.values()) / result.step_time, 6)
(True, 1.0)
"""

from commflow.plan.compute import CALIBRATION, CALIBRATIONS, Calibration, calibration_for
from commflow.plan.evaluate import Evaluation, evaluate, resolve_cluster
from commflow.plan.hardware import ACCELERATORS, Accelerator, get_accelerator
from commflow.plan.hetero import StageDevice, partition_layers, stage_devices
from commflow.plan.hfconfig import from_hf_config
from commflow.plan.memory import Memory, memory_per_gpu
from commflow.plan.models import MODELS, LatentAttention, TransformerSpec, get_model
from commflow.plan.parallel import Plan, check_plan, parse_plan
from commflow.plan.pipeline import OpTimes, PipelineRun, bubble_formula, simulate_schedule
from commflow.plan.search import SearchSpace, search
from commflow.plan.validation import PublishedRun, Validated, load_runs, summarize, validate

__all__ = [
    "ACCELERATORS",
    "CALIBRATION",
    "CALIBRATIONS",
    "MODELS",
    "Accelerator",
    "Calibration",
    "Evaluation",
    "LatentAttention",
    "Memory",
    "OpTimes",
    "PipelineRun",
    "Plan",
    "PublishedRun",
    "SearchSpace",
    "StageDevice",
    "TransformerSpec",
    "Validated",
    "bubble_formula",
    "calibration_for",
    "check_plan",
    "evaluate",
    "from_hf_config",
    "get_accelerator",
    "get_model",
    "load_runs",
    "memory_per_gpu",
    "parse_plan",
    "partition_layers",
    "resolve_cluster",
    "search",
    "simulate_schedule",
    "stage_devices",
    "summarize",
    "validate",
]
