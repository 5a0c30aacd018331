"""The rank side of ``commflow bench``: ``python -m commflow.bench.worker SPEC.json``.

Every rank reads the :class:`~commflow.bench.spec.RunSpec` the parent wrote, joins the
implementation's job, and for every size and placement runs ``warmup`` untimed iterations of
every algorithm, then timed rounds (``small_iters`` up to
:data:`~commflow.bench.spec.SMALL_BYTES`, ``iters`` above) in which the algorithms take
turns, one iteration each, in an order drawn per pair of rounds and reversed in the second
round of the pair (the same on every rank, drawn anew for every run, size and placement from
the spec's seed): a load changing on the host affects them alike, none always runs first
after a new size, and each follows every other as often as it precedes it (an algorithm that
runs right after another one's calls finds the caches and the peers as that one left them;
orders drawn by the round alone, the same at every size and in every run, let ``shm`` follow
``auto`` five times in 20 rounds and ``auto`` follow ``shm`` twice). A program file among
the algorithms is loaded once (:mod:`.algos`). Each iteration first resets the buffers
(:meth:`Case.prepare`, untimed), then enters the implementation's own barrier; the rank
times only the collective call (``time.perf_counter``). In the last round every rank counts
the elements of each algorithm's result that differ from the expected values. Each rank
writes its times and counts as JSON to ``rank<r>.json`` in the spec file's directory; rank 0
appends a line to ``progress`` there after each size. Nothing is pickled.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from commflow.bench.algos import label, resolve
from commflow.bench.cases import Case, CaseSpec, wrong_values
from commflow.bench.impl import Ranks, module
from commflow.bench.spec import RunSpec, emulated_host
from commflow.collectives import parse_collective
from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.runtime import dtype_of


def _measure(ranks: Ranks, spec: RunSpec, algos: list[tuple[str, str | Program]],
             case: Case, rounds: int) -> list[dict]:
    """Warm up every algorithm (``--algo`` entries and what they resolve to), then time
    ``rounds`` rounds of ``case``, one iteration of each algorithm per round in an order
    drawn per pair of rounds (seeded by the spec's seed, the case and the pair: every rank
    calls the same) and reversed in its second round; check each one's result in the last
    round."""
    calls = [ranks.operation(algo, case) for _, algo in algos]
    for call in calls:
        for _ in range(spec.warmup):
            case.prepare()
            ranks.barrier()
            call()
    times: list[list[float]] = [[] for _ in calls]
    wrong = [0] * len(calls)
    for i in range(rounds):
        seed = (spec.seed, case.spec.block, int(case.spec.inplace), i // 2)
        order = np.random.default_rng(seed).permutation(len(calls)).tolist()
        for j in order[::-1] if i % 2 else order:
            call = calls[j]
            case.prepare()
            ranks.barrier()
            start = time.perf_counter()
            call()
            times[j].append(time.perf_counter() - start)
            if i == rounds - 1:
                if spec.corrupt_rank == ranks.rank and case.expected is not None:
                    case.recv[:1] = wrong_values(case.expected[:1])
                wrong[j] = case.wrong()
    return [{"algo": label(entry), "block": case.spec.block, "inplace": case.spec.inplace,
             "times": t, "wrong": w} for (entry, _), t, w in zip(algos, times, wrong, strict=True)]


def run(spec: RunSpec, outdir: Path) -> None:
    """Run ``spec`` on this rank and write ``outdir/rank<r>.json``. With ``spec.hosts`` > 1
    this rank first takes its emulated host (``COMMFLOW_HOST``, commflow's ranks only), and
    its communicator must count ``nranks / hosts`` ranks on that host."""
    if spec.hosts > 1:
        nranks = int(os.environ["COMMFLOW_WORLD_SIZE"])
        os.environ["COMMFLOW_HOST"] = emulated_host(int(os.environ["COMMFLOW_RANK"]), nranks,
                                                    spec.hosts)
    ranks = module(spec.impl).connect(spec.timeout)
    if spec.hosts > 1 and ranks.local_size != ranks.nranks // spec.hosts:
        raise CommflowError(
            f"rank {ranks.rank} counts {ranks.local_size} rank(s) on its host where "
            f"{spec.hosts} emulated hosts hold {ranks.nranks // spec.hosts} each: report this "
            "as a bug")
    collective, dtype = parse_collective(spec.collective), dtype_of(spec.dtype)
    algos = [(entry, resolve(entry)) for entry in spec.algos]
    results = []
    for block in spec.blocks:
        rounds = spec.rounds(ranks.nranks, block)
        for inplace in (False, True):
            case = Case(
                CaseSpec(
                    collective=collective,
                    nranks=ranks.nranks,
                    rank=ranks.rank,
                    block=block,
                    dtype=dtype,
                    op=spec.op,
                    root=spec.root,
                    inplace=inplace,
                )
            )
            results += _measure(ranks, spec, algos, case, rounds)
        if ranks.rank == 0:
            with open(outdir / "progress", "a") as progress:
                progress.write(f"{block}\n")
    ranks.close()
    result = {"rank": ranks.rank, "nranks": ranks.nranks, "runs": results}
    (outdir / f"rank{ranks.rank}.json").write_text(json.dumps(result))


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is ``[SPEC.json]``; returns the exit status."""
    if len(argv) != 1:
        print("usage: python -m commflow.bench.worker SPEC.json", file=sys.stderr)
        return 2
    try:
        path = Path(argv[0])
        run(RunSpec.load(path), path.parent)
    except CommflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
