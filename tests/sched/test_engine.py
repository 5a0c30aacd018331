"""The scheduling simulator against closed forms: the priority toy of REFERENCES.md, DDP's
buckets, credits and partitions, and invariants on random workloads."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.sched import (
    POLICIES,
    CommCost,
    Policy,
    ScheduleError,
    Workload,
    fitted_cost,
    get_policy,
    lower_bound,
    ring_cost,
    simulate,
)
from commflow.sched.autotune import autotune
from commflow.sched.policies import MIB, _buckets, build

FREE = CommCost(alpha=0.0, bandwidth=1.0)
"""One second per byte, no latency: the toy's units."""


def toy(sync: float) -> Workload:
    return Workload.from_lists("toy", [1, 1, 1], [1, 1, 1], [sync] * 3)


FINE = Policy("fine", order="priority", partition_bytes=1e-3)


@pytest.mark.parametrize(("policy", "expected"), [
    ("fifo", 10.0), ("horovod", 10.0), ("priority", 9.0), ("pace", 8.0), (FINE, 8.0),
    ("dear", 8.0), ("ddp", 12.0),
])
def test_the_priority_toy(policy, expected):
    schedule = simulate(toy(2), policy, FREE)
    # a 1e-3 partition in flight is not taken back: fine partitions come within one of it
    assert schedule.iteration_time == pytest.approx(expected, abs=1.01e-3)
    assert schedule.lower_bound == 8.0


@pytest.mark.parametrize("policy", ["fifo", "priority", "pace", FINE, "dear", "horovod"])
def test_with_short_syncs_every_policy_gives_seven(policy):
    assert simulate(toy(1), policy, FREE).iteration_time == pytest.approx(7.0, abs=1e-6)


def test_ddp_buckets_close_at_their_caps_in_reverse_layer_order():
    sizes = [0.5, 10, 10, 10, 0.6, 0.6]
    work = Workload.from_lists("w", [1] * 6, [1] * 6, [s * MIB for s in sizes])
    # reverse order: 5 (0.6), 4 (0.6) closes the 1 MiB first bucket; 3, 2, 1 reach 30 >= 25
    assert _buckets(work, get_policy("ddp")) == [[5, 4], [3, 2, 1], [0]]
    assert _buckets(work, get_policy("fifo")) == [[5], [4], [3], [2], [1], [0]]
    graph = build(work, get_policy("ddp"), 1)
    assert [op.name for op in graph.ops] == ["AR4-5", "AR1-3", "AR0"]


def test_credits_overlap_latency_and_partitions_split_the_transfer():
    alpha, nbytes, part = 0.25, 8.0, 1.0
    work = Workload.from_lists("one", [0.0], [0.0], [nbytes])
    cost = CommCost(alpha=alpha, bandwidth=1.0)
    for credits, expected in ((1, 8 * (alpha + part)), (2, alpha + 8 * part),
                              (8, alpha + 8 * part)):
        policy = Policy("p", partition_bytes=part, credits=credits)
        assert simulate(work, policy, cost).iteration_time == pytest.approx(expected)
    whole = simulate(work, "fifo", cost).iteration_time
    assert whole == pytest.approx(alpha + nbytes)


def test_horovod_waits_for_the_cycle_and_fuses():
    work = Workload.from_lists("w", [0.0, 0.0], [0.3, 0.3], [1.0, 1.0])
    cost = CommCost(alpha=0.5, bandwidth=1.0)
    policy = Policy("h", fusion_bytes=10.0, cycle=1.0)
    schedule = simulate(work, policy, cost)
    # both gradients are ready by 0.6, seen at the 1.0 tick, fused: one latency, 2 bytes
    messages = [s for s in schedule.spans if s.lane == "comm" and s.iteration == 0]
    assert [(m.name, m.start, m.end) for m in messages] == [("AR1+1", 1.5, 3.5)]
    assert schedule.iteration_time == pytest.approx(3.5)


def test_fsdp_gathers_before_forward_and_backward_and_scatters_after():
    work = Workload.from_lists("w", [1, 1, 1], [1, 1, 1], [1, 1, 1])
    graph = build(work, get_policy("fsdp"), 2)
    names = [op.name for op in graph.ops if op.iteration == 0]
    assert sorted(names) == sorted(["AGf0", "AGf1", "AGf2", "AGb2", "AGb1", "AGb0",
                                    "RS0", "RS1", "RS2"])
    forward1 = next(t for t in graph.tasks if t.iteration == 1 and t.name == "F0")
    gather = graph.ops[forward1.waits[0]]
    assert gather.name == "AGf0" and gather.iteration == 1
    assert graph.ops[gather.after_ops[0]].name == "RS0"
    schedule = simulate(work, "fsdp", FREE)
    assert schedule.iteration_time >= schedule.lower_bound - 1e-9


workloads = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.01, 2), min_size=n, max_size=n),
    st.lists(st.floats(0.01, 2), min_size=n, max_size=n),
    st.lists(st.floats(0.0, 3), min_size=n, max_size=n)))


@settings(max_examples=40, deadline=None)
@given(workloads, st.sampled_from(sorted(POLICIES)), st.floats(0.0, 0.3))
def test_invariants_on_random_workloads(lists, policy, alpha):
    work = Workload.from_lists("w", *lists)
    cost = CommCost(alpha=alpha, bandwidth=2.0)
    schedule = simulate(work, policy, cost, iterations=4)
    compute = work.forward_time + work.backward_time
    assert schedule.iteration_time >= compute - 1e-9
    assert schedule.iteration_time >= schedule.lower_bound - 1e-9
    for lane in ("compute", "comm"):
        spans = sorted((s for s in schedule.spans if s.lane == lane), key=lambda s: s.start)
        assert all(a.end <= b.start + 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    starts = [s.start for s in schedule.spans if s.lane == "compute"]
    assert starts == sorted(starts)
    if policy in ("fifo", "priority", "pace", "p3", "bytescheduler"):  # one allreduce a layer
        reduced: dict[tuple[str, int], float] = {}
        for span in schedule.spans:
            if span.lane == "comm":
                key = (span.name, span.iteration)
                reduced[key] = max(reduced.get(key, 0.0), span.end)
        for span in schedule.spans:
            if span.lane == "compute" and span.name[0] == "F" and span.iteration > 0:
                key = ("AR" + span.name[1:], span.iteration - 1)
                assert span.start >= reduced.get(key, 0.0) - 1e-9


def test_costs_in_closed_form_and_fitted():
    ring = ring_cost(8, 10, step_latency=25e-6)
    assert ring.alpha == pytest.approx(14 * 25e-6)
    assert ring.bandwidth == pytest.approx(1.25e9 * 8 / 14)
    assert ring.time("reducescatter", 1e6) * 2 == pytest.approx(ring.time("allreduce", 1e6))
    fitted = fitted_cost({1e6: ring.time("allreduce", 1e6), 1e8: ring.time("allreduce", 1e8)})
    assert (fitted.alpha, fitted.bandwidth) == (pytest.approx(ring.alpha),
                                               pytest.approx(ring.bandwidth))


def test_autotune_is_the_best_of_its_grid():
    work = Workload.from_lists("w", [0.002] * 4, [0.004] * 4, [4 * MIB, 2 * MIB, 8 * MIB, MIB])
    cost = ring_cost(4, 10)
    best = autotune(work, cost, partitions=(MIB, 4 * MIB), credits=(1, 3))
    grid = [simulate(work, dataclasses.replace(get_policy("bytescheduler"),
                                               partition_bytes=p, credits=c), cost)
            for p in (MIB, 4 * MIB) for c in (1, 3)]
    assert best.iteration_time == min(s.iteration_time for s in grid)
    assert best.policy.name == "bytescheduler-tuned"


@pytest.mark.parametrize(("call", "message"), [
    (lambda: get_policy("tictoc"), "unknown policy 'tictoc'"),
    (lambda: Policy("x", credits=0), "credits must be >= 1"),
    (lambda: Policy("x", order="lifo"), "order must be one of"),
    (lambda: Workload.from_lists("w", [1], [1, 2], [1]), "give one of each per layer"),
    (lambda: Workload("w", ()), "has no layers"),
    (lambda: simulate(toy(1), "fifo", FREE, iterations=1), ">= 2 iterations"),
    (lambda: ring_cost(1, 10), ">= 2 workers"),
    (lambda: CommCost(0.0, 0.0), "bandwidth > 0"),
])
def test_bad_input_is_refused_clearly(call, message):
    with pytest.raises(ScheduleError, match=message):
        call()


def test_bound_of_a_communication_bound_workload_is_the_link():
    work = Workload.from_lists("w", [0.1] * 3, [0.1] * 3, [10.0] * 3)
    cost = CommCost(alpha=0.5, bandwidth=1.0)
    assert lower_bound(work, cost) == pytest.approx(0.5 + 30)
    # every allreduce pays its latency; the link idles while the last layer runs forward
    # and backward (its gradient is the first ready): 3 x 10.5 + 0.2
    assert math.isclose(simulate(work, "pace", cost).iteration_time, 31.7)
