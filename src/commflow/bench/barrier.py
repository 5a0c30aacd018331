"""Barrier latency of commflow, torch.distributed gloo and Open MPI (``commflow bench barrier``).

Every rank of one implementation runs ``warmup`` untimed barriers, then ``iters`` timed ones,
each after an untimed barrier so that the ranks enter it together, as the collective benchmark
starts every iteration (:mod:`.worker`). An iteration's time is the slowest rank's; the result
is the median with its 95% confidence interval (:mod:`.stats`). The ranks are started as for
the collectives (:func:`commflow.bench.harness.run_impl`): ``python -m commflow.bench.barrier
SPEC.json``, writing their times as JSON next to the spec. Nothing is pickled.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from commflow.bench.harness import start_ranks
from commflow.bench.impl import IMPLS, module
from commflow.bench.stats import Summary, summarize
from commflow.errors import CommflowError


@dataclass(frozen=True, kw_only=True)
class BarrierSpec:
    """What the ranks of one implementation run."""

    impl: str
    """``commflow``, ``gloo`` or ``mpi``."""
    warmup: int = 5
    """Untimed barriers."""
    iters: int = 20
    """Timed barriers."""
    timeout: float = 300.0
    """Seconds any wait of the implementation may take."""


@dataclass(frozen=True, kw_only=True)
class BarrierResult:
    """One implementation's barrier time."""

    impl: str
    """``commflow``, ``gloo`` or ``mpi``."""
    nranks: int
    """Number of ranks."""
    time: Summary
    """Median (s) over the timed barriers of the slowest rank's time, with its 95% interval."""

    def record(self) -> dict:
        """The JSON record: ``impl, collective ("barrier"), nranks, time_us, ci95_us, runs``."""
        ci = None if self.time.ci is None else [t * 1e6 for t in self.time.ci]
        return {"impl": self.impl, "collective": "barrier", "nranks": self.nranks,
                "time_us": self.time.median * 1e6, "ci95_us": ci, "runs": self.time.runs}


def run_barrier(spec: BarrierSpec, nranks: int) -> BarrierResult:
    """Time ``spec.iters`` barriers of ``spec.impl`` on ``nranks`` ranks of this machine.

    Raises ``CommflowError`` when the ranks fail or time out (their output is on standard
    error, prefixed with the rank)."""
    if spec.impl not in IMPLS:
        raise CommflowError(f"unknown implementation {spec.impl!r}; use one of {IMPLS}")
    if spec.iters < 1 or spec.warmup < 0:
        raise CommflowError(f"need --iters >= 1 and -w >= 0, got {spec.iters}, {spec.warmup}")
    with tempfile.TemporaryDirectory(prefix="commflow-barrier-") as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(asdict(spec)))
        command = [sys.executable, "-m", "commflow.bench.barrier", str(path)]
        budget = spec.timeout + 0.01 * 2 * (spec.warmup + spec.iters)
        status = start_ranks(spec.impl, command, nranks, budget)
        if status != 0:
            why = "timed out" if status == 124 else f"exited with status {status}"
            raise CommflowError(f"{spec.impl} barrier ranks {why}; their output is above "
                                f"(prefixed with the rank)")
        times = [json.loads((Path(tmp) / f"rank{r}.json").read_text())
                 for r in range(nranks)]
    slowest = np.max(times, axis=0)
    return BarrierResult(impl=spec.impl, nranks=nranks, time=summarize(slowest.tolist()))


def compare_barriers(nranks: int, *, peers: tuple[str, ...] = ("gloo",), warmup: int = 5,
                     iters: int = 20, timeout: float = 300.0
                     ) -> tuple[list[BarrierResult], list[str]]:
    """commflow's barrier, then each peer's, on ``nranks`` ranks: the results and notes on
    peers that could not run (not installed, failed). commflow's failure raises."""
    results = [run_barrier(BarrierSpec(impl="commflow", warmup=warmup, iters=iters,
                                       timeout=timeout), nranks)]
    notes = []
    for peer in peers:
        why = module(peer).missing()
        if why:
            notes.append(f"{peer} skipped: {why}")
            continue
        try:
            results.append(run_barrier(BarrierSpec(impl=peer, warmup=warmup, iters=iters,
                                                   timeout=timeout), nranks))
        except CommflowError as error:
            notes.append(f"{peer} failed: {error}")
    return results, notes


def main(argv: list[str]) -> int:
    """Rank entry point: ``argv`` is ``[SPEC.json]``; returns the exit status."""
    if len(argv) != 1:
        print("usage: python -m commflow.bench.barrier SPEC.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    spec = BarrierSpec(**json.loads(path.read_text()))
    ranks = module(spec.impl).connect(spec.timeout)
    for _ in range(spec.warmup):
        ranks.barrier()
    times = []
    for _ in range(spec.iters):
        ranks.barrier()
        start = time.perf_counter()
        ranks.barrier()
        times.append(time.perf_counter() - start)
    ranks.close()
    (path.parent / f"rank{ranks.rank}.json").write_text(json.dumps(times))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
