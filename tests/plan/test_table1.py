"""Calibration: Megatron-LM SC'21 Table 1 (Narayanan et al. 2021), ten GPT models on up to
3072 A100s, predicted TFLOP/s per GPU within 10% of the published values with the one set of
constants in ``commflow.plan.compute.CALIBRATION``.

Configurations from Megatron-LM ``examples/sc21/run_table_1.sh``: fp16, full recompute
(``--recompute-method uniform``), interleaved schedule where it sets
``--num-layers-per-virtual-pipeline-stage``, torch DDP (overlapped gradient all-reduce) for
the data-parallel-only rows, local DDP (not overlapped) for the others.
"""

from __future__ import annotations

import pytest

from commflow.plan import Plan, evaluate

# model, tp, pp, gpus, global batch, micro-batch, virtual stages, overlap, published TFLOP/s
TABLE_1 = [
    ("megatron-1.7b", 1, 1, 32, 512, 16, 1, True, 137),
    ("megatron-3.6b", 2, 1, 64, 512, 16, 1, True, 138),
    ("megatron-7.5b", 4, 1, 128, 512, 16, 1, True, 142),
    ("megatron-18b", 8, 1, 256, 1024, 8, 1, True, 135),
    ("megatron-39b", 8, 2, 512, 1536, 4, 1, False, 138),
    ("megatron-76b", 8, 4, 1024, 1792, 2, 3, False, 140),
    ("megatron-145b", 8, 8, 1536, 2304, 2, 2, False, 148),
    ("megatron-310b", 8, 16, 1920, 2160, 1, 2, False, 155),
    ("megatron-530b", 8, 35, 2520, 2520, 1, 3, False, 163),
    ("megatron-1t", 8, 64, 3072, 3072, 1, 1, False, 163),
]


def table1_plan(tp, pp, gpus, gbs, mbs, vp, overlap) -> Plan:
    return Plan(
        tp=tp,
        pp=pp,
        dp=gpus // (tp * pp),
        mb=mbs,
        global_batch=gbs,
        vp=vp,
        schedule="interleaved" if vp > 1 else "1f1b",
        recompute="full",
        overlap=overlap,
        precision="fp16",
    )


@pytest.mark.parametrize("row", TABLE_1, ids=[r[0] for r in TABLE_1])
def test_table1_tflops_within_10_percent(row):
    name, *config, published = row
    result = evaluate(name, "dgx-a100", table1_plan(*config), accelerator="a100-80gb")
    assert result.tflops_per_gpu_hw == pytest.approx(published, rel=0.10)
    assert result.fits
    assert result.mfu < result.tflops_per_gpu_hw * 1e12 / 312e12
