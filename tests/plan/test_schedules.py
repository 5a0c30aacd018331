"""ZB-H2 and Chimera against their papers' closed forms: Qi et al. 2024 (Table 1: bubble
``(p-1)(F+B-2W)``, peak activations ``(2p-1)M_B``) and Li & Hoefler 2021 (Table 2: bubble ratio
``(D-2)/(2N+D-2)``, weights ``2M_θ``, activations at most ``D·M_a``); their constraints and
their place in the search."""

from __future__ import annotations

import pytest

from commflow.errors import CommflowError
from commflow.plan import MODELS, OpTimes, Plan, SearchSpace, evaluate, memory_per_gpu
from commflow.plan.memory import in_flight, stage_params
from commflow.plan.parallel import check_plan
from commflow.plan.pipeline import bubble_formula, formula_makespan, simulate_schedule
from commflow.plan.search import candidates

GPT = MODELS["gpt3-6.7b"]  # 32 layers


def uniform(p: int, f: float, b: float, w: float) -> OpTimes:
    return OpTimes([[f]] * p, [[b]] * p, [[w]] * p)


@pytest.mark.parametrize(("schedule", "bubble"), [
    ("1f1b", 3 * (1 + 2 + 1)),      # (p-1)(F+B+W)
    ("zb-h1", 3 * (1 + 2 - 1)),     # (p-1)(F+B-W)
    ("zb-h2", 3 * (1 + 2 - 2)),     # (p-1)(F+B-2W)
    ("chimera", (4 - 2) / 2 * 4),   # (D-2)/2 · (F+B+W)
])  # fmt: skip
def test_bubble_formulas_of_the_papers(schedule, bubble):
    assert bubble_formula(schedule, 4, 1.0, 2.0, 1.0) == bubble
    run = formula_makespan(schedule, uniform(4, 1.0, 2.0, 1.0), 8, 0.0)
    assert run.makespan == 8 * 4.0 + bubble


def test_zero_bubble_h2_is_zero_for_equal_passes_and_never_negative():
    assert bubble_formula("zb-h2", 8, 1.0, 1.0, 1.0) == 0.0
    assert bubble_formula("zb-h2", 8, 1.0, 1.0, 2.0) == 0.0
    assert bubble_formula("zb-h1", 8, 1.0, 1.0, 1.0) == 7.0  # a third of 1F1B's 21


@pytest.mark.parametrize(("d", "n"), [(4, 4), (8, 16), (16, 32)])
def test_chimera_bubble_ratio_is_d_minus_2_over_2n_plus_d_minus_2(d, n):
    run = formula_makespan("chimera", uniform(d, 1.0, 1.5, 0.5), n, 0.0)
    busy = n * 3.0
    assert run.stage_busy == (busy,) * d
    assert (run.makespan - busy) / run.makespan == pytest.approx((d - 2) / (2 * n + d - 2))
    gpipe = formula_makespan("1f1b", uniform(d, 1.0, 1.5, 0.5), n, 0.0)
    assert (gpipe.makespan - busy) / gpipe.makespan == pytest.approx((d - 1) / (n + d - 1))


def test_chimera_rank_runs_half_its_micro_batches_on_each_of_its_two_stages():
    times = OpTimes([[1.0]] * 3 + [[1.6]], [[2.0]] * 3 + [[2.6]], [[1.0]] * 3 + [[1.2]])
    run = formula_makespan("chimera", times, 8, 0.0)
    # ranks 0 and 3 hold the slow last stage once each: 8/2 · (4 + 5.4)
    assert run.stage_busy == pytest.approx((37.6, 32.0, 32.0, 37.6))
    assert run.makespan == pytest.approx(37.6 + (4 - 2) / 2 * (1.6 + 2.6 + 1.2))


def test_zb_h2_simulation_keeps_the_paper_bubble_plus_the_last_w_and_2p_minus_1_in_flight():
    p, m = 4, 8
    run = simulate_schedule("zb-h2", uniform(p, 1.0, 2.0, 1.0), m, 0.0)
    assert run.stage_offset == (0.0, 1.0, 2.0, 3.0)  # the parallelogram: stage s starts s·F late
    assert run.makespan == m * 4.0 + 3 * (1 + 2 - 2) + 1.0  # formula + one trailing W
    assert run.makespan < simulate_schedule("zb-h1", uniform(p, 1.0, 2.0, 1.0), m, 0.0).makespan
    held, peak = 0, 0
    for op in sorted((op for op in run.intervals if op.stage == 0), key=lambda op: op.start):
        held += {"F": 1, "B": 0, "W": -1}[op.kind]
        peak = max(peak, held)
    assert peak == 2 * p - 1


def test_memory_zb_h2_in_flight_and_chimera_doubled_layer_states():
    base = dict(tp=8, pp=4, dp=1, mb=1, global_batch=16)
    assert in_flight(Plan(**base, schedule="zb-h2")) == 7  # (2p-1) M_B
    assert in_flight(Plan(tp=8, pp=4, global_batch=4, schedule="zb-h2")) == 4  # only m exist
    assert in_flight(Plan(**base, schedule="chimera")) == 4  # D·M_a, as 1F1B's first stage
    one, two = Plan(**base), Plan(**base, schedule="chimera")
    layers = GPT.layers / 4 * GPT.layer_params / 8
    assert stage_params(GPT, two) - stage_params(GPT, one) == pytest.approx(layers)
    m1, m2 = memory_per_gpu(GPT, one), memory_per_gpu(GPT, two)
    assert m2.states - m1.states == pytest.approx(16 * layers)  # weights, grads, Adam twice
    assert m2.activations == m1.activations
    zb = memory_per_gpu(GPT, Plan(**base, schedule="zb-h2"))
    assert zb.activations == pytest.approx(m1.activations * 7 / 4)


@pytest.mark.parametrize(("pp", "batch", "message"), [
    (3, 12, r"chimera needs an even number of stages \(pp=3\)"),
    (4, 6, r"chimera needs micro-batches \(6\) a multiple of pp \(4\)"),
])  # fmt: skip
def test_chimera_constraints_are_clear_errors(pp, batch, message):
    model = MODELS["gpt3-1.3b"] if pp == 4 else MODELS["megatron-1.7b"]
    plan = Plan(tp=1, pp=pp, dp=1, global_batch=batch, schedule="chimera")
    with pytest.raises(CommflowError, match=message):
        check_plan(model, plan, gpus=pp, gpus_per_box=8)


def test_evaluate_ranks_chimera_and_zb_h2_by_their_smaller_bubbles():
    base = dict(tp=4, pp=4, dp=2, mb=1, global_batch=64, sp=True, recompute="selective")
    results = {s: evaluate(GPT, "dgx-a100x4", Plan(**base, schedule=s))
               for s in ("1f1b", "zb-h1", "zb-h2", "chimera")}  # fmt: skip
    bubbles = [results[s].breakdown["pp_bubble"] for s in ("1f1b", "zb-h1", "zb-h2", "chimera")]
    assert bubbles == sorted(bubbles, reverse=True)
    for r in results.values():
        assert sum(r.breakdown.values()) == pytest.approx(r.step_time)
    chimera = results["chimera"]
    assert chimera.pipeline.extrapolated and not chimera.pipeline.intervals
    assert chimera.memory.states > results["1f1b"].memory.states
    assert results["zb-h2"].memory.activations > results["zb-h1"].memory.activations


def test_search_space_has_zb_h2_and_chimera_only_where_it_applies():
    space = SearchSpace(micro_batches=(1,), virtual_stages=(2,))
    plans = list(candidates(MODELS["gpt3-1.3b"], 16, 8, 32, "bf16", space))
    chimera = [p for p in plans if p.schedule == "chimera"]
    assert {p.schedule for p in plans} >= {"zb-h2", "chimera"}
    assert chimera and all(p.pp % 2 == 0 and p.microbatches % p.pp == 0 for p in chimera)
    assert {p.pp for p in plans if p.schedule == "zb-h2"} == {p.pp for p in plans if p.pp > 1}
