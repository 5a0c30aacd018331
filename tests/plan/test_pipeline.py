"""Pipeline schedules: makespans against the bubble formulas, dependencies, extrapolation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.errors import CommflowError
from commflow.plan import OpTimes, simulate_schedule
from commflow.plan.pipeline import formula_makespan, schedule_makespan, stage_order


def uniform(p: int, v: int, f: float, b: float, w: float) -> OpTimes:
    return OpTimes([[f] * v] * p, [[b] * v] * p, [[w] * v] * p)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_gpipe_and_1f1b_match_the_bubble_formula(p, m, schedule):
    # uniform stages, free p2p: (m + p - 1)(F + B + W)
    run = simulate_schedule(schedule, uniform(p, 1, 1.0, 1.5, 0.5), m, 0.0)
    assert run.makespan == pytest.approx((m + p - 1) * 3.0)
    assert run.stage_busy == pytest.approx((m * 3.0,) * p)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 4, 6)])
def test_interleaved_bubble_shrinks_by_v(p, v, m):
    # a stage's work split into v chunks: bubble (p-1)/v of a micro-batch's stage time
    per_chunk = 3.0 / v
    run = simulate_schedule(
        "interleaved", uniform(p, v, per_chunk / 3, per_chunk / 3, per_chunk / 3), m, 0.0
    )
    assert run.makespan == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)


def test_zero_bubble_beats_1f1b():
    times = uniform(4, 1, 1.0, 1.0, 1.0)
    one_f_one_b = simulate_schedule("1f1b", times, 8, 0.0).makespan
    zb = simulate_schedule("zb-h1", times, 8, 0.0)
    assert one_f_one_b == 33.0
    assert zb.makespan == 28.0  # busy 24 + bubble 4 (ideal ZB-H1: (p-1)(F+B-W) = 3)
    assert sum(i.kind == "W" for i in zb.intervals) == 4 * 8


def test_dependencies_hold_with_p2p_delay():
    p2p = 0.25
    run = simulate_schedule("1f1b", uniform(3, 1, 1.0, 2.0, 0.0), 4, p2p)
    end = {(i.kind, i.microbatch, i.stage): i for i in run.intervals}
    for (kind, mb, stage), op in end.items():
        if kind == "F" and stage > 0:
            assert op.start >= end[("F", mb, stage - 1)].end + p2p - 1e-12
        if kind == "B" and stage < 2:
            assert op.start >= end[("B", mb, stage + 1)].end + p2p - 1e-12
    assert run.makespan >= (4 + 2) * 3.0 + 2 * 2 * p2p  # busy + bubble + p2p on the chain
    one = simulate_schedule("1f1b", uniform(2, 1, 1.0, 2.0, 0.0), 1, p2p)
    assert one.makespan == 2 * 3.0 + 2 * p2p  # F, p2p, F, B, p2p, B


def test_orders_alternate_after_warmup():
    assert stage_order("1f1b", 0, 3, 4) == [
        ("F", 0, 0),
        ("F", 1, 0),
        ("F", 2, 0),
        ("B", 0, 0),
        ("F", 3, 0),
        ("B", 1, 0),
        ("B", 2, 0),
        ("B", 3, 0),
    ]
    assert stage_order("interleaved", 1, 2, 2, 2)[:2] == [("F", 0, 0), ("F", 1, 0)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"])
def test_extrapolation_equals_full_simulation(schedule):
    p, v = 8, (2 if schedule == "interleaved" else 1)
    times = OpTimes(
        [[1.0] * v] * (p - 1) + [[1.3] * v],
        [[2.0] * v] * (p - 1) + [[2.6] * v],
        [[1.0] * v] * (p - 1) + [[1.3] * v],
    )
    fast = schedule_makespan(schedule, times, 64, 0.01)
    full = schedule_makespan(schedule, times, 64, 0.01, exact=True)
    assert fast.makespan == pytest.approx(full.makespan, rel=1e-12)
    assert len(full.intervals) > len(fast.intervals)


def test_formula_is_exact_for_uniform_1f1b():
    times = uniform(4, 1, 1.0, 1.5, 0.5)
    assert formula_makespan("1f1b", times, 8, 0.0).makespan == pytest.approx(
        simulate_schedule("1f1b", times, 8, 0.0).makespan
    )


def test_unknown_schedule_and_chimera_without_simulation():
    with pytest.raises(CommflowError, match="unknown pipeline schedule 'pipedream'"):
        simulate_schedule("pipedream", uniform(2, 1, 1, 1, 1), 2, 0.0)
    with pytest.raises(CommflowError, match="chimera has no event simulation"):
        simulate_schedule("chimera", uniform(2, 1, 1, 1, 1), 2, 0.0)


def test_1f1b_sends_block_the_sender_and_interleaved_overlaps_them():
    p2p = 0.25
    run = simulate_schedule("1f1b", uniform(3, 1, 1.0, 2.0, 0.0), 6, p2p)
    for stage in range(3):
        ops = sorted((op for op in run.intervals if op.stage == stage), key=lambda op: op.start)
        for op, nxt in zip(ops, ops[1:], strict=False):
            sends = op.kind == "F" and stage < 2 or op.kind == "B" and stage > 0
            if sends:
                assert nxt.start >= op.end + p2p - 1e-12
    assert run.stage_busy == simulate_schedule("1f1b", uniform(3, 1, 1.0, 2.0, 0.0), 6,
                                               0.0).stage_busy
    # interleaved: a stage's next op may start right after a send (no wait for it)
    inter = simulate_schedule("interleaved", uniform(2, 2, 1.0, 2.0, 0.0), 4, p2p)
    gaps = []
    for stage in range(2):
        ops = sorted((op for op in inter.intervals if op.stage == stage), key=lambda op: op.start)
        gaps += [nxt.start - op.end for op, nxt in zip(ops, ops[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.0)
