"""Plans: parsing, validation, divisibility against model and cluster."""

from __future__ import annotations

import pytest

from commflow.errors import CommflowError
from commflow.plan import MODELS, Plan, check_plan, parse_plan


def test_parse_round_trip():
    plan = parse_plan(
        "tp=8,pp=16,dp=24,mb=1,vp=2,sp=1,cp=1,zero=1,recompute=full", global_batch=3072
    )
    assert plan == Plan(
        tp=8,
        pp=16,
        dp=24,
        mb=1,
        vp=2,
        sp=True,
        zero=1,
        recompute="full",
        schedule="interleaved",
        global_batch=3072,
    )
    assert parse_plan(plan.describe()) == plan
    assert plan.gpus == 3072 and plan.microbatches == 128


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tp=8,foo=1", "foo"),
        ("tp=x", "integer"),
        ("zero=4", "zero"),
        ("recompute=some", "recompute"),
        ("vp=2,schedule=1f1b", "interleaved"),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(CommflowError, match=message):
        parse_plan(text)


def test_check_plan_lists_every_problem():
    model = MODELS["megatron-1t"]  # 160 heads, 128 layers
    plan = Plan(tp=16, pp=3, dp=2, mb=1, global_batch=7)
    with pytest.raises(CommflowError) as info:
        check_plan(model, plan, gpus=64, gpus_per_box=8)
    text = str(info.value)
    for fragment in ("96", "64 GPUs", "box", "128 layers", "multiple of dp*mb"):
        assert fragment in text
    check_plan(model, Plan(tp=8, pp=64, dp=6, global_batch=3072), gpus=3072, gpus_per_box=8)
