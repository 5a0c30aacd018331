"""A runtime change against the code before it: ``commflow bench`` of one algorithm under an
earlier commit and under the working tree, run in turns (old, new, new, old, old, new, ...)
so that both see the same drift of a shared machine and each follows the other as often as
it precedes it, and the median time of each over the runs.

Run: ``.venv/bin/python benchmarks/versus_commit.py COMMIT --collectives allgather,reducescatter
--ranks 2,4 --reps 3 -- --algo shm -b 256K -e 64M -f 4 --iters 20`` (what follows ``--`` goes
to every ``commflow bench``; ``--vs none`` is added). The commit is checked out into a
temporary git worktree and run from its ``src`` (``PYTHONPATH``), with this checkout's venv.
Prints one markdown row per collective, ranks, placement and size: both medians in
microseconds, new over old, and the ratio of each run pair.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from commflow.units import format_size

ROOT = Path(__file__).resolve().parents[1]
COMMFLOW = Path(sys.executable).with_name("commflow")


def _bench(src: Path, collective: str, ranks: int, extra: list[str], out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([str(COMMFLOW), "bench", collective, "-n", str(ranks), "--vs", "none",
                    *extra, "--json-out", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL, cwd=ROOT)
    return [r for r in json.loads(out.read_text()) if r["impl"] == "commflow"]


def main() -> None:
    """Parse the command line and print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", help="the earlier commit (any git revision)")
    parser.add_argument("--collectives", default="allreduce")
    parser.add_argument("--ranks", default="2")
    parser.add_argument("--reps", type=int, default=3)
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    times: dict[tuple, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(old), args.commit],
                       cwd=ROOT, check=True)
        try:
            trees = [("old", old / "src"), ("new", ROOT / "src")]
            for rep in range(args.reps):
                for which, src in trees if rep % 2 == 0 else trees[::-1]:
                    for collective in args.collectives.split(","):
                        for ranks in map(int, args.ranks.split(",")):
                            out = Path(tmp) / f"{which}-{collective}-{ranks}-{rep}.json"
                            for r in _bench(src, collective, ranks, extra, out):
                                key = (collective, ranks, r["inplace"], r["size"], r["algo"])
                                times[key + (which,)].append(r["time_us"])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                           check=True)
    print("| collective | ranks | placement | size | algo | old (us) | new (us) | new / old "
          "| per run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted({k[:-1] for k in times}):
        before, after = times[key + ("old",)], times[key + ("new",)]
        pairs = ", ".join(f"{b / a:.2f}" for a, b in zip(before, after, strict=True))
        collective, ranks, inplace, size, algo = key
        print(f"| {collective} | {ranks} | {'in-place' if inplace else 'out-of-place'} | "
              f"{format_size(size)} | {algo} | {np.median(before):.1f} | "
              f"{np.median(after):.1f} | {np.median(after) / np.median(before):.2f} | "
              f"{pairs} |")


if __name__ == "__main__":
    main()
