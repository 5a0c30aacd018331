"""search() and ``commflow plan``: ranking, memory filter, JSON fields equal the library's."""

from __future__ import annotations

import json

import pytest

from commflow.errors import CommflowError
from commflow.plan import SearchSpace, evaluate, get_model, parse_plan, search
from commflow.plan.models import MODELS
from commflow.plan.search import candidates

SPACE = SearchSpace(micro_batches=(1, 2), virtual_stages=(2,), recompute=("selective", "full"))


def test_search_ranks_fitting_plans_fastest_first():
    results = search("gpt3-6.7b", "dgx-a100", gpus=16, global_batch=32, top=4, space=SPACE)
    assert len(results) == 4
    times = [r.step_time for r in results]
    assert times == sorted(times) and all(r.fits for r in results)
    best = results[0].plan
    assert evaluate("gpt3-6.7b", "dgx-a100x2", best).step_time == pytest.approx(times[0])


def test_candidates_respect_divisibility():
    plans = list(candidates(MODELS["gpt3-6.7b"], 16, 8, 32, "bf16", SPACE))
    assert plans
    for p in plans:
        assert p.gpus == 16 and 8 % p.tp == 0 and 32 % (p.pp * p.vp) == 0
        assert p.global_batch % (p.dp * p.mb) == 0


def test_search_reports_when_nothing_fits():
    with pytest.raises(CommflowError, match="no valid plan .* fits"):
        search("gpt3-175b", "dgx-a100", gpus=8, global_batch=8, space=SPACE)


def test_cli_plan_json_matches_library(commflow):
    text = "tp=8,pp=2,dp=1,mb=1,sp=1,recompute=selective"
    run = commflow("plan", "--model", "gpt3-6.7b", "--cluster", "dgx-a100", "--gpus", "16",
                   "--global-batch", "16", "--plan", text, "--json")  # fmt: skip
    assert run.code == 0, run.stderr
    [record] = json.loads(run.stdout)
    expected = evaluate("gpt3-6.7b", "dgx-a100x2", parse_plan(text, global_batch=16))
    want = expected.to_dict()
    assert record.pop("breakdown") == pytest.approx(want.pop("breakdown"))
    assert record.pop("memory_gib") == pytest.approx(want.pop("memory_gib"))
    for key in ("stage_layers", "stage_accelerators"):
        assert record.pop(key) == want.pop(key)
    assert record == pytest.approx(want)


def test_cli_search_table_and_timeline(commflow, tmp_path):
    run = commflow("plan", "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "16",
                   "--top", "3")  # fmt: skip
    assert run.code == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 5 and lines[1].split()[:3] == ["plan", "step(s)", "tokens/s"]
    assert lines[2].startswith("tp") and lines[2].split()[-7] == "yes"
    png = tmp_path / "step.png"
    run = commflow("plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "16",
                   "--plan", "tp=2,pp=4,dp=2,vp=2", "--timeline", str(png))  # fmt: skip
    assert run.code == 0, run.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_exit_2(commflow):
    run = commflow("plan", "--model", "nope", "--global-batch", "8", "--gpus", "8")
    assert run.code == 2 and "unknown model" in run.stderr


def test_printing_a_result_shows_the_plan_not_the_timeline():
    best = search("gpt3-6.7b", "dgx-a100", gpus=16, global_batch=32, top=1, space=SPACE)[0]
    deep = parse_plan("tp=2,pp=4,dp=2,mb=1", global_batch=64)
    exact = evaluate("gpt3-6.7b", "dgx-a100x2", deep, pipeline="exact")
    assert len(exact.pipeline.intervals) > 100  # the timeline a dataclass repr would dump
    for result in (best, exact):
        text = repr(result)
        assert len(text) < 2048 and "\n" not in text
        assert text.startswith(f"Evaluation(plan={result.plan.describe()!r}, ")
        assert f"intervals={len(result.pipeline.intervals)}" in text


def _table(run):
    assert run.code == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    header = lines.index(next(line for line in lines if line.startswith("plan ")))
    return lines[header].split(), [line.split() for line in lines[header + 1:]], lines[:header]


def test_cli_table_shows_cp_ep_zero3_columns_only_when_non_zero(commflow):
    base = ("plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "16")
    header, rows, _ = _table(commflow(*base, "--plan", "tp=8,pp=1,dp=2"))
    assert header[8:] == ["compute", "tp", "pp_bubble", "dp", "optimizer", "overhead"]
    header, rows, _ = _table(commflow(*base, "--seq", "8192", "--plan",
                                      "tp=2,cp=4,pp=1,dp=2,zero=3,overlap=0"))  # fmt: skip
    assert header[8:] == ["compute", "tp", "cp", "zero3", "pp_bubble", "dp", "optimizer",
                          "overhead"]  # fmt: skip
    expected = evaluate(get_model("gpt3-1.3b", seq=8192), "dgx-a100x2",
                        parse_plan("tp=2,cp=4,pp=1,dp=2,zero=3,overlap=0", global_batch=16))
    cells = dict(zip(header[8:], rows[0][-8:], strict=True))
    assert float(cells["cp"]) == pytest.approx(expected.breakdown["cp"], abs=5e-4)
    assert float(cells["zero3"]) == pytest.approx(expected.breakdown["zero3_gather"], abs=5e-4)
    assert expected.breakdown["cp"] > 0 and expected.breakdown["zero3_gather"] > 0


def test_cli_train_tokens_days_and_gpu_hours(commflow):
    args = ("plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "16",
            "--plan", "tp=2,pp=1,dp=8", "--train-tokens")  # fmt: skip
    header, rows, notes = _table(commflow(*args, "300B"))
    assert header[-2:] == ["days", "GPU_hours"] and "training 3e+11 tokens" in notes[-1]
    result = evaluate("gpt3-1.3b", "dgx-a100x2", parse_plan("tp=2,pp=1,dp=8", global_batch=16))
    steps = -(-300e9 // (16 * 2048))
    assert float(rows[0][-2]) == pytest.approx(steps * result.step_time / 86400, abs=0.05)
    assert float(rows[0][-1]) == pytest.approx(steps * result.step_time * 16 / 3600, abs=0.5)
    run = commflow(*args, "1.5T", "--json")
    [record] = json.loads(run.stdout)
    assert record["steps"] == -(-1.5e12 // (16 * 2048))
    assert record["gpu_hours"] == pytest.approx(record["train_time_s"] * 16 / 3600)
    assert set(record["memory_gib"]) == {"weights", "gradients", "optimizer", "activations",
                                         "buffers", "total"}  # fmt: skip
    for bad in ("lots", "-5", "0"):
        run = commflow(*args, bad)
        assert run.code == 2 and "token count" in run.stderr


def test_cli_schedules_option_and_chimera_has_no_timeline(commflow, tmp_path):
    run = commflow("plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
                   "--top", "3", "--schedules", "chimera", "--json")  # fmt: skip
    assert run.code == 0, run.stderr
    records = json.loads(run.stdout)
    assert all("schedule=chimera" in r["plan"] or "pp=1," in r["plan"] for r in records)
    assert all(len(r["stage_layers"]) == len(r["stage_accelerators"]) for r in records)
    run = commflow("plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
                   "--schedules", "1f1b,pipedream")  # fmt: skip
    assert run.code != 0 and "schedules are a comma-separated list of gpipe" in run.stderr
    run = commflow("plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "32",
                   "--plan", "tp=1,pp=2,dp=8,schedule=chimera", "--timeline",
                   str(tmp_path / "c.png"))  # fmt: skip
    assert run.code != 0 and "chimera is timed by its closed form" in run.stderr
