"""examples/train_ddp.py trains under `commflow run` and under torchrun (a tiny model, a few
steps) and prints its loss and summary lines; with ``--backend both`` the commflow and the
gloo replica print the same losses."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
BIN = Path(sys.executable).parent
TINY = [
    "--steps",
    "2",
    "--warmup",
    "1",
    "--layers",
    "1",
    "--dim",
    "32",
    "--heads",
    "2",
    "--seq",
    "16",
    "--vocab",
    "64",
    "--batch",
    "4",
]
RUNS = {
    "commflow run, both backends": (
        [str(BIN / "commflow"), "run", "-n", "2", "--no-prefix"],
        ["--backend", "both"],
    ),
    "torchrun": ([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2"], []),
}
LOSS = re.compile(
    r"^(\w+): loss ([\d.]+) -> ([\d.]+) \(ln vocab = ([\d.]+), chain entropy = ([\d.]+)\)$",
    re.MULTILINE,
)
SUMMARY = re.compile(
    r"^(\w+): 2 ranks, ([\d.]+)M params, step ([\d.]+) ms \(median of 2\), (\d+) tokens/s, "
    r"communication ([\d.]+)% of the step$",
    re.MULTILINE,
)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_example_trains_under_both_launchers(run):
    launcher, flags = RUNS[run]
    done = subprocess.run(
        [*launcher, str(EXAMPLE), *TINY, *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses, summaries = LOSS.findall(done.stdout), SUMMARY.findall(done.stdout)
    backends = ["commflow", "gloo"] if flags else ["commflow"]
    assert [loss[0] for loss in losses] == [s[0] for s in summaries] == backends
    assert len({loss[1:] for loss in losses}) == 1  # the replicas train identically
    _, first, last, ln_vocab, entropy = losses[0]
    assert (float(ln_vocab), float(entropy)) == (round(math.log(64), 3), round(math.log(4), 3))
    assert abs(float(first) - math.log(64)) < 0.2  # small initial weights: near-uniform logits
    assert math.isfinite(float(last))
    for _, params, step_ms, tokens, share in summaries:
        assert params == "0.02"
        step = float(step_ms) / 1e3  # printed to 0.1 ms
        assert 2 * 4 * 16 / (step + 5e-5) - 1 <= int(tokens) <= 2 * 4 * 16 / (step - 5e-5) + 1
        assert 0 <= float(share) <= 100
