"""The search space: ZeRO 0-3, context parallelism for long sequences, expert parallelism for
MoE models, the zero-bubble and Chimera schedules, recompute modes and virtual stages, and
valid search results."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from commflow.plan import SearchSpace, TransformerSpec, evaluate, get_model, search
from commflow.plan.models import MODELS
from commflow.plan.parallel import check_plan
from commflow.plan.search import CP_MIN_SEQ, candidates

DATA = Path(__file__).parent / "data"
SMALL = SearchSpace(micro_batches=(1,), virtual_stages=(2,))


def _options(plans):
    return {name: {getattr(p, name) for p in plans}
            for name in ("zero", "cp", "ep", "schedule", "recompute", "vp")}  # fmt: skip


def test_dense_short_sequence_enumerates_zero_schedules_recompute_vp():
    plans = list(candidates(MODELS["gpt3-1.3b"], 16, 8, 32, "bf16", SMALL))
    options = _options(plans)
    assert options == {
        "zero": {0, 1, 2, 3}, "cp": {1}, "ep": {1},
        "schedule": {"1f1b", "interleaved", "zb-h1", "zb-h2", "chimera"},
        "recompute": {"none", "selective", "full"}, "vp": {1, 2},
    }  # fmt: skip
    for p in plans:
        check_plan(MODELS["gpt3-1.3b"], p, gpus=16, gpus_per_box=8)
        assert (p.schedule == "interleaved") == (p.vp > 1)
        assert p.pp > 1 or p.schedule == "1f1b"


def test_context_parallel_from_8192_tokens():
    llama = get_model(DATA / "llama-3.1-8b.json", seq=32768)
    assert SearchSpace().cp_sizes(llama) == [1, 2, 4, 8, 16]
    assert SearchSpace(max_context_parallel=4).cp_sizes(llama) == [1, 2, 4]
    assert SearchSpace().cp_sizes(replace(llama, seq=CP_MIN_SEQ - 1024)) == [1]
    assert SearchSpace().cp_sizes(replace(llama, seq=8200)) == [1, 2, 4, 8]  # 8200 = 1025 · 8
    plans = list(candidates(llama, 32, 8, 32, "bf16", SMALL))
    assert _options(plans)["cp"] == {1, 2, 4, 8, 16}
    assert all(p.tp * p.cp * p.pp * p.dp == 32 and llama.seq % p.cp == 0 for p in plans)


def test_expert_parallel_for_moe_models():
    mixtral = get_model(DATA / "mixtral-8x7b.json")
    assert SearchSpace().ep_sizes(mixtral) == [1, 2, 4, 8]
    assert SearchSpace().ep_sizes(MODELS["llama3-8b"]) == [1]
    plans = list(candidates(mixtral, 64, 8, 64, "bf16", SMALL))
    assert _options(plans)["ep"] == {1, 2, 4, 8}
    assert all(p.dp % p.ep == 0 and 8 % p.ep == 0 for p in plans)


def test_search_returns_valid_fitting_plans_of_the_wider_space():
    llama = get_model(DATA / "llama-3.1-8b.json", seq=16384)
    results = search(llama, "dgx-h100", gpus=32, global_batch=32, top=3, space=SMALL)
    assert len(results) == 3
    assert [r.step_time for r in results] == sorted(r.step_time for r in results)
    for r in results:
        assert r.fits
        check_plan(llama, r.plan, gpus=32, gpus_per_box=8)
        again = evaluate(llama, "dgx-h100x4", r.plan)
        assert again.step_time == pytest.approx(r.step_time)
        assert sum(r.breakdown.values()) == pytest.approx(r.step_time)


def test_moe_search_uses_expert_parallelism():
    moe = TransformerSpec(name="moe", hidden=2048, layers=16, heads=16, vocab=32000, seq=2048,
                          ffn=5632, gated_mlp=True, experts=16, top_k=2,
                          tied_embeddings=False, position_embeddings=False)  # fmt: skip
    results = search(moe, "dgx-a100", gpus=16, global_batch=64, top=5, space=SMALL)
    assert all(r.fits and moe.experts % r.plan.ep == 0 for r in results)
    # sharding the experts cuts each GPU's optimizer step and gradient reduction more than
    # the all-to-alls cost here
    assert results[0].plan.ep > 1 and results[0].breakdown["ep"] > 0


def test_1t_on_3072_gpus_searches_the_whole_space_in_under_a_minute():
    # benchmarks/plan_search.py times the same search (docs/benchmarks.md, "Planner search")
    start = time.perf_counter()
    results = search("megatron-1t", "dgx-a100", gpus=3072, global_batch=3072, precision="fp16",
                     top=3)
    assert time.perf_counter() - start < 60
    assert len(results) == 3 and all(r.fits for r in results)
    assert {r.plan.schedule for r in results} <= set(SearchSpace().schedules)
