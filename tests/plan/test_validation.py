"""Validation against published runs (benchmarks/plan_validation.py, docs/planner.md): the
held-out part meets its goal (median |error| <= 5%, max <= 15%, no row class with a median
above 10%), the data file is complete, and the table in docs/planner.md is what the script
prints."""

from __future__ import annotations

import re
import runpy
from dataclasses import replace
from pathlib import Path

import pytest

from commflow.plan import Plan
from commflow.plan.compute import CALIBRATIONS
from commflow.plan.validation import (
    CLASSES,
    PublishedRun,
    fit_calibration,
    load_runs,
    log_errors,
    sources,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = runpy.run_path(str(ROOT / "benchmarks" / "plan_validation.py"))


@pytest.fixture(scope="module")
def rows():
    return validate()


def test_held_out_part_meets_the_goal(rows):
    held_out = [r for r in rows if r.run.split == "test"]
    summary = SCRIPT["summarize"](held_out)
    assert summary["median"] <= 0.05
    assert summary["max"] <= 0.15
    for name in CLASSES:
        assert summary[f"median {name}"] <= 0.10, name


def test_data_covers_sources_classes_and_both_parts():
    runs = load_runs()
    assert len(runs) >= 40
    used = {run.source for run in runs}
    assert used == set(sources()) and len(used) >= 5
    for name in CLASSES:
        for split in ("fit", "test"):
            assert any(name in r.classes and r.split == split for r in runs), (name, split)
    assert {r.split for r in runs} == {"fit", "test"}
    assert len({r.id for r in runs}) == len(runs)


def test_metrics_convert_to_seconds_per_step():
    run = next(r for r in load_runs() if r.id == "nemo2407-llama2-7b-8")
    assert run.published_step == pytest.approx(128 * 4096 / (8 * 16847))
    mfu = next(r for r in load_runs() if r.id == "korthikanti-gpt3-175b")
    flops = 72 * 64 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (12 * 96 * 12288))
    assert mfu.published_step == pytest.approx(flops / (64 * 312e12 * 0.514), rel=1e-9)
    odd = PublishedRun(id="x", source="s", model=run.model, cluster="dgx-h100",
                       accelerator="h100-sxm", plan=Plan(), metric="furlongs", value=1.0,
                       split="fit", where="")
    with pytest.raises(Exception, match="unknown metric"):
        _ = odd.published_step


def test_docs_table_is_what_the_script_prints(rows):
    doc = (ROOT / "docs" / "planner.md").read_text()
    block = re.search(r"```text\n(# \d+ sources.*?)```", doc, flags=re.DOTALL)
    assert block is not None
    header = f"# {len(sources())} sources; table: src/commflow/plan/data/published_runs.json"
    assert block.group(1).rstrip("\n").splitlines() == [header, *SCRIPT["report"](rows)]


def test_fit_calibration_lowers_the_error_of_its_rows():
    runs = [r for r in load_runs("fit") if r.id in ("dgxc-gpt3-175b-bf16-128",
                                                     "dgxc-llama3.1-8b-bf16-8")]
    start = replace(CALIBRATIONS[("h100", "bf16")], gemm_efficiency=0.5)
    before = sum(e * e for e in log_errors(runs, start))
    fitted = fit_calibration(runs, start, evaluations=6)
    assert sum(e * e for e in log_errors(runs, fitted)) < before / 4
    assert 0.2 <= fitted.gemm_efficiency <= 1.0
