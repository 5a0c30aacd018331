"""examples/train_fsdp_tp.py (2-D DeviceMesh dp=2 x tp=2, FSDP2 ``fully_shard``, tensor
parallelism through DTensor, a functional all-reduce) trains on 4 ranks of the commflow
backend with the losses gloo gives for the same seeds."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from .harness import run_group

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_fsdp_tp.py"


def _train_both() -> dict[str, list[float]]:
    spec = importlib.util.spec_from_file_location("train_fsdp_tp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {b: module.train(b, dp=2, tp=2, steps=3, dim=16) for b in ("gloo", "commflow")}


def test_fsdp_tp_losses_match_gloo() -> None:
    results = run_group(_train_both, 4, backend=None, timeout=60.0)
    gloo = results[0]["gloo"]
    assert len(gloo) == 3 and all(math.isfinite(v) for v in gloo)
    assert gloo[-1] < gloo[0]  # it trains
    for rank, losses in enumerate(results):
        assert losses["gloo"] == gloo, f"rank {rank}: gloo losses differ across ranks"
        for mine, ref in zip(losses["commflow"], gloo, strict=True):
            assert math.isclose(mine, ref, rel_tol=1e-5), (rank, losses["commflow"], gloo)
