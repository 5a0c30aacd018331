"""The timeline PNG: compute and communication lanes per stage, boxes that add up to the
breakdown of the step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from commflow.errors import CommflowError
from commflow.plan import evaluate, parse_plan
from commflow.plan.models import MODELS
from commflow.plan.timeline import draw_timeline, lane_boxes

LONG = replace(MODELS["gpt3-1.3b"], seq=8192)


def _exact(text: str, model=LONG, cluster="dgx-a100x4", batch=16):
    return evaluate(model, cluster, parse_plan(text, global_batch=batch), pipeline="exact")


def test_lanes_of_tp_cp_zero3_sends_and_dp(tmp_path):
    result = _exact("tp=2,cp=2,pp=4,dp=2,vp=2,zero=3,overlap=0")
    png = tmp_path / "step.png"
    lanes = draw_timeline(result, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert lanes == ["compute", "TP", "CP", "ZeRO-3 gather", "PP send", "DP reduce"]
    boxes = lane_boxes(result)
    for stage in range(4):  # the breakdown's parts of every stage, op by op
        for lane, part in (("TP", "tp"), ("CP", "cp"), ("ZeRO-3 gather", "zero3_gather")):
            total = sum(d for _, d in boxes[stage, lane])
            assert total == pytest.approx(result.breakdown[part])
        [(start, duration)] = boxes[stage, "DP reduce"]
        assert start == result.pipeline.stage_end[stage]
        assert duration == pytest.approx(result.exposed_dp) and duration > 0
    # 16 forward and 16 backward ops of stage 0 each end with their collectives, in order
    ops = [i for i in result.pipeline.intervals if i.stage == 0 and i.kind in ("F", "B")]
    assert len(boxes[0, "TP"]) == len(ops) == 32
    last = boxes[0, "ZeRO-3 gather"]
    assert sorted(start + d for start, d in last) == pytest.approx(sorted(i.end for i in ops))
    # every op but the last hop sends its activations / gradients to the next stage
    assert len(boxes[0, "PP send"]) == 16 + 8 and len(boxes[3, "PP send"]) == 8 + 16


def test_zero1_gather_and_single_stage(tmp_path):
    result = _exact("tp=8,pp=4,dp=2,vp=2,sp=1,zero=1,recompute=selective",
                    model=MODELS["gpt3-175b"], cluster="dgx-a100x8")  # fmt: skip
    lanes = draw_timeline(result, tmp_path / "a.png")
    assert lanes == ["compute", "TP", "PP send", "DP reduce", "ZeRO param gather"]
    [(start, duration)] = lane_boxes(result)[0, "ZeRO param gather"]
    assert duration == pytest.approx(result.zero_gather) and result.zero_gather > 0
    assert result.breakdown["dp"] == pytest.approx(result.exposed_dp)
    alone = _exact("tp=1,pp=1,dp=8", model=MODELS["gpt3-125m"], cluster="dgx-a100", batch=8)
    assert draw_timeline(alone, tmp_path / "b.png") == ["compute", "DP reduce"]


def test_extrapolated_runs_are_refused(tmp_path):
    result = evaluate(LONG, "dgx-a100x4", parse_plan("tp=2,pp=4,dp=4", global_batch=64))
    with pytest.raises(CommflowError, match="pipeline='exact'"):
        draw_timeline(result, tmp_path / "x.png")
