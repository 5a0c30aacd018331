"""Benchmarks of real collectives: commflow's runtime against torch.distributed gloo and Open MPI.

``commflow bench`` is :func:`run_benchmark` plus formatting::

    from commflow.bench import BenchConfig, run_benchmark

    report = run_benchmark(BenchConfig(collective="allreduce", nranks=2,
                                       sizes=(8, 1 << 20), peers=("gloo", "mpi")))
    for m in report.measurements:
        print(m.record())

Every iteration starts with a barrier and its time is the slowest rank's; a size reports the
median over its timed iterations (``BenchConfig.small_iters``, by default ten times ``iters``,
up to :data:`SMALL_BYTES`; ``iters`` above) with a nonparametric 95% confidence interval
(:mod:`~commflow.bench.stats`), and every rank checks its last result element by element
(:mod:`~commflow.bench.cases`). Units: bytes, seconds, bytes/second; :meth:`Measurement.record`
gives the JSON form (microseconds, GB/s).
"""

from commflow.bench.cases import Case, CaseSpec
from commflow.bench.harness import Measurement, run_impl
from commflow.bench.impl import IMPLS, PEER_ALGO
from commflow.bench.memory import copy_bandwidth, staged_busbw_bound
from commflow.bench.plot import plot_busbw
from commflow.bench.spec import SMALL_BYTES, RunSpec, timed_rounds
from commflow.bench.stats import Summary, median, median_ci_ranks, summarize
from commflow.bench.suite import (
    SMALL_ITERS_FACTOR,
    BenchConfig,
    BenchReport,
    commflow_algorithms,
    default_nranks,
    run_benchmark,
)

__all__ = [
    "IMPLS",
    "PEER_ALGO",
    "SMALL_BYTES",
    "SMALL_ITERS_FACTOR",
    "BenchConfig",
    "BenchReport",
    "Case",
    "CaseSpec",
    "Measurement",
    "RunSpec",
    "Summary",
    "commflow_algorithms",
    "copy_bandwidth",
    "default_nranks",
    "median",
    "median_ci_ranks",
    "plot_busbw",
    "run_benchmark",
    "run_impl",
    "staged_busbw_bound",
    "summarize",
    "timed_rounds",
]
