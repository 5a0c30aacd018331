"""The parent side of ``commflow bench``: start one implementation's ranks, collect, summarize.

commflow and gloo ranks are started by :func:`commflow.runtime.launcher.launch`, Open MPI's by
``mpirun``; all run ``python -m commflow.bench.worker SPEC.json`` (:mod:`.worker`) and write
their per-iteration times as JSON. The time of an iteration is the largest over the ranks
(every iteration started with a barrier); a size's time is the median of its iterations, with
the 95% confidence interval of :mod:`.stats`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commflow.bench.cases import size_bytes
from commflow.bench.spec import RunSpec
from commflow.bench.stats import Summary, summarize
from commflow.collectives import Collective, busbw_factor, parse_collective
from commflow.errors import CommflowError
from commflow.runtime import dtype_of
from commflow.runtime.launcher import launch

Progress = Callable[[int], None]
"""Called with the number of sizes finished so far (every algorithm, both placements)."""

_POLL = 0.2
_SLOWEST = 25e6


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One implementation's result for one algorithm, size and placement."""

    impl: str
    """``commflow``, ``gloo`` or ``mpi``."""
    collective: Collective
    """The collective."""
    algo: str
    """Algorithm (commflow's name, or ``default`` for a peer's own choice)."""
    nranks: int
    """Number of ranks."""
    dtype: str
    """Element type."""
    op: str
    """Reduction operator (``none`` for collectives that do not reduce)."""
    root: int
    """Root rank (-1 for collectives without one)."""
    size: int
    """Bytes, nccl-tests' convention (allgather: the output; reduce-scatter: the input)."""
    count: int
    """Elements per call as nccl-tests counts them (one rank's block when blocked)."""
    inplace: bool
    """Whether send and receive buffers were one buffer."""
    time: Summary
    """Median iteration time, its 95% confidence interval and the number of runs (s)."""
    algbw: float
    """``size / median time``, bytes/s."""
    busbw: float
    """``algbw`` times nccl-tests' factor for the collective, bytes/s."""
    wrong: int
    """Elements that differed from the expected values, summed over the ranks."""
    rank_means: tuple[float, ...] = ()
    """Each rank's mean time of the timed iterations (s), in rank order (what nccl-tests
    reports per rank before ``-a`` combines the ranks)."""
    hosts: int = 1
    """Emulated hosts the ranks were split into (1: one host, shared memory; more: the engine
    transport between them, ``commflow bench --hosts``)."""

    def record(self) -> dict:
        """The JSON record: ``impl, collective, algo, nranks, hosts, dtype, op, size, inplace,
        time_us, ci95_us, runs, algbw, busbw, wrong`` (GB/s, microseconds; ``ci95_us`` is
        ``[low, high]`` or ``None`` with fewer than 6 runs; ``runs`` is the number of timed
        iterations of this size: ``small_iters`` up to :data:`.spec.SMALL_BYTES`, ``iters``
        above)."""
        ci = None if self.time.ci is None else [t * 1e6 for t in self.time.ci]
        return {
            "impl": self.impl,
            "collective": self.collective.value,
            "algo": self.algo,
            "nranks": self.nranks,
            "hosts": self.hosts,
            "dtype": self.dtype,
            "op": self.op,
            "size": self.size,
            "inplace": self.inplace,
            "time_us": self.time.median * 1e6,
            "ci95_us": ci,
            "runs": self.time.runs,
            "algbw": self.algbw / 1e9,
            "busbw": self.busbw / 1e9,
            "wrong": self.wrong,
        }


def run_impl(spec: RunSpec, nranks: int, *, progress: Progress | None = None) -> list[Measurement]:
    """Run ``spec`` on ``nranks`` ranks of ``spec.impl`` and summarize every (algorithm,
    size, placement), the ranks exchanging files in a fresh temporary directory.

    Raises ``CommflowError`` when the ranks fail or time out (their output, prefixed with the
    rank, is on standard error) or do not write their results.
    """
    with tempfile.TemporaryDirectory(prefix="commflow-bench-") as tmp:
        path = Path(tmp) / "spec.json"
        spec.save(path)
        command = [sys.executable, "-m", "commflow.bench.worker", str(path)]
        budget = _budget(spec, nranks)
        done = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(Path(tmp) / "progress", progress, done), daemon=True
        )
        watcher.start()
        try:
            status = start_ranks(spec.impl, command, nranks, budget)
        finally:
            done.set()
            watcher.join()
        if status != 0:
            why = "timed out" if status == 124 else f"exited with status {status}"
            raise CommflowError(
                f"{spec.impl} benchmark ranks {why}; their output is above (prefixed with the rank)"
            )
        ranks = [_load(Path(tmp) / f"rank{r}.json", spec.impl) for r in range(nranks)]
    return combine_ranks(spec, ranks)


def start_ranks(impl: str, command: list[str], nranks: int, timeout: float) -> int:
    """Start ``nranks`` ranks of ``command`` for ``impl`` (the launcher; ``mpirun`` for Open
    MPI) and wait for them; returns the exit status (124 after ``timeout`` seconds)."""
    if impl != "mpi":
        return launch(command, nranks, timeout=timeout)
    mpirun = ["mpirun", "-n", str(nranks), "--oversubscribe"]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    try:
        return subprocess.run([*mpirun, *command], timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        return 124


def _budget(spec: RunSpec, nranks: int) -> float:
    """Seconds the whole job may take before it is stopped: the per-wait timeout, plus for
    every iteration (warm-up and timed, each size's own count of timed rounds:
    :meth:`RunSpec.rounds`) 10 ms and its bytes at a pessimistic 25 MB/s."""
    collective = parse_collective(spec.collective)
    itemsize = dtype_of(spec.dtype).itemsize
    budget = spec.timeout
    for block in spec.blocks:
        size = size_bytes(collective, nranks, block, itemsize)
        iterations = 2 * len(spec.algos) * (spec.warmup + spec.rounds(nranks, block))
        budget += iterations * (0.01 + size / _SLOWEST)
    return budget


def _watch(path: Path, progress: Progress | None, done: threading.Event) -> None:
    """Report the lines of rank 0's progress file until ``done``."""
    seen = -1
    while progress is not None:
        finished = done.wait(_POLL)
        count = len(path.read_text().splitlines()) if path.exists() else 0
        if count != seen:
            seen = count
            progress(count)
        if finished:
            return


def _load(path: Path, impl: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CommflowError(
            f"{impl} benchmark rank wrote no readable result {path.name}: {err}"
        ) from None


def combine_ranks(spec: RunSpec, ranks: list[dict]) -> list[Measurement]:
    """Measurements from the ranks' results (``rank<r>.json`` contents, in rank order): each
    iteration takes the slowest rank's time, ``wrong`` adds the ranks' counts. Raises
    ``CommflowError`` when the ranks' runs do not line up."""
    collective = parse_collective(spec.collective)
    nranks = len(ranks)
    itemsize = dtype_of(spec.dtype).itemsize
    factor = busbw_factor(collective, nranks)
    out = []
    for i, first in enumerate(ranks[0]["runs"]):
        runs = [rank["runs"][i] for rank in ranks]
        if any(
            (run["algo"], run["block"], run["inplace"])
            != (first["algo"], first["block"], first["inplace"])
            for run in runs
        ):
            raise CommflowError(
                f"{spec.impl} benchmark ranks disagree on run {i}: report this as a bug"
            )
        slowest = np.max([run["times"] for run in runs], axis=0)
        time = summarize(slowest.tolist())
        size = size_bytes(collective, nranks, first["block"], itemsize)
        algbw = size / time.median if time.median > 0 else float("inf")
        out.append(
            Measurement(
                impl=spec.impl,
                collective=collective,
                algo=first["algo"],
                nranks=nranks,
                dtype=spec.dtype,
                op=spec.op if collective.reduces else "none",
                root=spec.root if collective.rooted else -1,
                size=size,
                count=first["block"],
                inplace=first["inplace"],
                time=time,
                algbw=algbw,
                busbw=algbw * factor,
                wrong=sum(run["wrong"] for run in runs),
                rank_means=tuple(float(np.mean(run["times"])) for run in runs),
                hosts=spec.hosts,
            )
        )
    return out
