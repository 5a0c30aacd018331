"""benchmarks/versus_commit.py (docs/benchmarks.md, "Staging only what the peers read") runs
``commflow bench`` under an earlier commit and the working tree in turns and prints one row per
placement and size, then removes its worktree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "versus_commit.py"


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def test_the_script_prints_both_medians_and_their_ratio():
    before = _worktrees()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "HEAD", "--collectives", "allgather", "--ranks", "2",
         "--reps", "1", "--", "--algo", "shm", "-b", "1K", "-e", "4K", "-f", "4",
         "--iters", "2", "--small-iters", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    header, rule, *rows = done.stdout.strip().split("\n")
    assert header.startswith("| collective | ranks | placement | size | algo | old (us)")
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [(c[2], c[3]) for c in cells] == [
        ("out-of-place", "1K"), ("out-of-place", "4K"), ("in-place", "1K"), ("in-place", "4K")]
    for c in cells:
        assert c[:2] == ["allgather", "2"] and c[4] == "shm"
        old, new, ratio = float(c[5]), float(c[6]), float(c[7])
        # medians printed to 0.1 us, ratios to 0.01
        assert abs(ratio - new / old) <= 0.005 + 0.05 * (1 + new / old) / old
        assert c[8] == c[7]  # one run: its ratio is the medians' ratio
    assert _worktrees() == before
