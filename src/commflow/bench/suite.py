"""``commflow bench`` as a library call: commflow against its peers on the same sizes.

:func:`run_benchmark` measures the machine's copy bandwidth, runs commflow's algorithms, then
each peer (torch.distributed gloo, Open MPI) on the same sizes, and returns every
:class:`~commflow.bench.harness.Measurement` with the memory-bandwidth bound and notes on the
peers that could not run.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from commflow import algorithms
from commflow.bench.algos import check_program_file, label
from commflow.bench.cases import block_elements
from commflow.bench.harness import Measurement, run_impl
from commflow.bench.impl import IMPLS, PEER_ALGO, module
from commflow.bench.memory import copy_bandwidth, staged_busbw_bound
from commflow.bench.spec import SMALL_BYTES, RunSpec, timed_rounds
from commflow.collectives import Collective, parse_collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.runtime import DEFAULT_TIMEOUT, OPS, algorithm_names, dtype_of, variants
from commflow.runtime.programs import check_algorithm, is_program_file
from commflow.runtime.world import usable_cpus
from commflow.tune import Versus, versus_fixed

SMALL_ITERS_FACTOR = 10
"""``BenchConfig.small_iters`` defaults to this many times ``iters``."""

BenchProgress = Callable[[str, int, int], None]
"""Called as ``progress(impl, done, total)`` with the sizes done and to do."""


def default_nranks() -> int:
    """The number of CPUs this process may run on (its affinity), at least 2."""
    return max(2, usable_cpus())


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to benchmark; every field is validated on construction (``CommflowError``)."""

    collective: Collective | str = Collective.ALLREDUCE
    """The collective (a name is parsed)."""
    nranks: int = field(default_factory=default_nranks)
    """Number of ranks (processes on this host); default :func:`default_nranks`."""
    sizes: tuple[int, ...] = (8,)
    """Requested sizes in bytes (nccl-tests' convention), rounded down to whole elements and
    blocks; sizes that round to the same buffers run once."""
    dtype: str = "float32"
    """Element type (float16, bfloat16, float32, float64, int8, uint8, int32, int64, bool)."""
    op: str = "sum"
    """Reduction operator: sum, prod, min, max or avg (floating-point types only)."""
    root: int = 0
    """Root rank of rooted collectives."""
    algos: tuple[str, ...] = ("auto",)
    """commflow algorithms to run, or ``("all",)`` for :func:`commflow_algorithms`; an entry
    ending in ``.json`` is a program file (:mod:`~commflow.bench.algos`)."""
    peers: tuple[str, ...] = ("gloo",)
    """Peer implementations measured on the same sizes: ``gloo``, ``mpi`` (may be empty)."""
    warmup: int = 5
    """Untimed iterations per size and placement."""
    iters: int = 20
    """Timed iterations per size and placement above :data:`~commflow.bench.spec.SMALL_BYTES`
    (6 or more give a 95% interval)."""
    small_iters: int | None = None
    """Timed iterations per size and placement up to
    :data:`~commflow.bench.spec.SMALL_BYTES` (64 KiB); ``None``: ten times ``iters``, as the
    OSU micro-benchmarks run more iterations for small messages (set on construction)."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds any wait inside an implementation may take."""
    hosts: int = 1
    """Emulated hosts commflow's ranks are split into, of consecutive ranks each: between
    them messages take the engine transport (gloo over loopback TCP), as between machines;
    within one, shared memory (the peers run as always)."""

    def __post_init__(self) -> None:
        coll = parse_collective(self.collective)
        object.__setattr__(self, "collective", coll)
        dtype = dtype_of(self.dtype)
        object.__setattr__(self, "dtype", dtype.name)
        if self.op not in OPS:
            raise CommflowError(f"unknown op {self.op!r}; use one of {', '.join(OPS)}")
        if self.op == "avg" and dtype.kind != "f" and dtype.name != "bfloat16":
            raise CommflowError(f"op 'avg' needs a floating-point dtype, got {dtype.name}")
        if self.nranks < 1:
            raise CommflowError(f"cannot benchmark on {self.nranks} ranks: use -n 1 or more")
        if not self.sizes or min(self.sizes) < 1:
            raise CommflowError(f"sizes must be positive byte counts, got {self.sizes}")
        if not 0 <= self.root < self.nranks:
            raise CommflowError(f"root {self.root} is outside ranks 0..{self.nranks - 1}")
        if self.warmup < 0 or self.iters < 1:
            raise CommflowError(f"need -w >= 0 and --iters >= 1, got {self.warmup}, {self.iters}")
        if self.small_iters is None:
            object.__setattr__(self, "small_iters", SMALL_ITERS_FACTOR * self.iters)
        elif self.small_iters < 1:
            raise CommflowError(
                f"need --small-iters >= 1 (timed iterations per size up to "
                f"{SMALL_BYTES >> 10} KiB), got {self.small_iters}"
            )
        if self.timeout <= 0:
            raise CommflowError(f"timeout must be positive, got {self.timeout}")
        unknown = [p for p in self.peers if p not in IMPLS[1:]]
        if unknown:
            raise CommflowError(f"unknown peer(s) {', '.join(unknown)}; use gloo, mpi or none")
        if not self.algos:
            raise CommflowError("no commflow algorithm given: use --algo NAME or --algo all")
        self._check_hosts()
        if self.algos != ("all",):
            for name in self.algos:
                if is_program_file(name):
                    check_program_file(name, coll, self.nranks, self.root)
                    continue
                check_algorithm(coll, name)
                if name != "auto" and not variants.is_fast(name):
                    algorithms.build(coll, name, self.nranks)
            labels = [label(name) for name in self.algos]
            if len(set(labels)) < len(labels):
                raise CommflowError(
                    f"--algo entries {', '.join(self.algos)} repeat a name; program files are "
                    f"labelled by file name, so give each a different one"
                )

    def _check_hosts(self) -> None:
        """Emulated hosts must split the ranks evenly, run no fast path (it needs one host)
        and have the gloo engine (torch)."""
        if self.hosts == 1:
            return
        if not 1 <= self.hosts <= self.nranks or self.nranks % self.hosts:
            raise CommflowError(
                f"--hosts {self.hosts} does not split {self.nranks} ranks evenly: give a "
                f"divisor of -n (1 for one host, {self.nranks} for a host per rank)")
        fast = [name for name in self.algos if variants.is_fast(name)]
        if fast:
            raise CommflowError(
                f"--algo {', '.join(fast)}: the shared-memory fast path runs on one host, not "
                f"across {self.hosts} emulated hosts; use program algorithms, auto or all")
        why = module("gloo").missing()
        if why:
            raise CommflowError(f"--hosts {self.hosts} needs gloo for the engine between hosts: "
                                f"{why}")

    @property
    def commflow_algos(self) -> tuple[str, ...]:
        """The commflow algorithms to run, ``all`` expanded (without the fast path across
        emulated hosts)."""
        if self.algos == ("all",):
            return commflow_algorithms(self.collective, self.nranks, fast=self.hosts == 1)
        return self.algos

    def timed_rounds(self, size: int) -> int:
        """Timed iterations per placement of a size of ``size`` bytes
        (:func:`~commflow.bench.spec.timed_rounds`)."""
        return timed_rounds(size, self.iters, self.small_iters)  # type: ignore[arg-type]

    @property
    def blocks(self) -> tuple[int, ...]:
        """Elements per block of every distinct size, ascending."""
        itemsize = dtype_of(self.dtype).itemsize
        found = {block_elements(self.collective, self.nranks, s, itemsize) for s in self.sizes}
        return tuple(sorted(found))


def commflow_algorithms(collective: Collective, nranks: int, *,
                        fast: bool = True) -> tuple[str, ...]:
    """``auto`` and every algorithm the runtime can run for ``collective`` on ``nranks`` ranks
    (:func:`commflow.runtime.algorithm_names`: the ``shm`` fast path where it covers the
    collective and ``fast`` (the ranks share one host), and the registered programs that
    build for ``nranks``)."""
    names = ["auto"]
    for name in algorithm_names(collective):
        if name == variants.NAME and not fast:
            continue
        if name != variants.NAME:
            try:
                algorithms.build(collective, name, nranks)
            except AlgorithmError:
                continue
        names.append(name)
    return tuple(names)


@dataclass(frozen=True, kw_only=True)
class BenchReport:
    """Everything one benchmark run measured."""

    config: BenchConfig
    """What was run."""
    measurements: list[Measurement]
    """One per (implementation, algorithm, size, placement), commflow first."""
    copy_bandwidth: float | None
    """Single-process memory copy bandwidth, bytes copied per second (``None`` across
    emulated hosts, where no shared-memory bound applies)."""
    load: tuple[float, float, float]
    """The host's load averages (1, 5, 15 min) when the run started: other processes on the
    cores disturb the timings."""
    bound: float | None
    """Upper bound on busbw (bytes/s) of a copy-in/copy-out shared-memory implementation
    (:func:`~commflow.bench.memory.staged_busbw_bound`; ``None`` across emulated hosts)."""
    notes: list[str] = field(default_factory=list)
    """Why a peer did not run (not installed, operation unsupported, failed)."""

    def reference_algo(self) -> str:
        """The commflow algorithm that ratios compare: ``auto`` if it ran, else the first
        (as :attr:`Measurement.algo` labels it)."""
        algos = self.config.commflow_algos
        return "auto" if "auto" in algos else label(algos[0])

    def ratios(self, peer: str) -> dict[tuple[int, bool], float]:
        """``{(size, inplace): commflow busbw / peer busbw}`` for :meth:`reference_algo`."""
        ours = {
            (m.size, m.inplace): m.busbw
            for m in self.measurements
            if m.impl == "commflow" and m.algo == self.reference_algo()
        }
        return {
            (m.size, m.inplace): ours[(m.size, m.inplace)] / m.busbw
            for m in self.measurements
            if m.impl == peer and (m.size, m.inplace) in ours and m.busbw > 0
        }

    def auto_versus_fixed(self, *, inplace: bool = False) -> Versus | None:
        """``auto`` against the fastest fixed commflow algorithm at each size of the run and
        over the sweep (:func:`commflow.tune.versus_fixed`); ``None`` unless ``auto`` and a
        fixed algorithm both ran."""
        rows = [(m.algo, m.size, m.time.median) for m in self.measurements
                if m.impl == "commflow" and m.inplace == inplace]
        algos = {algo for algo, _, _ in rows}
        if "auto" not in algos or len(algos) < 2:
            return None
        return versus_fixed(rows)

    def best_algorithms(self) -> list[Measurement]:
        """commflow's fastest algorithm (largest busbw) per size and placement."""
        best: dict[tuple[int, bool], Measurement] = {}
        for m in self.measurements:
            key = (m.size, m.inplace)
            if m.impl == "commflow" and (key not in best or m.busbw > best[key].busbw):
                best[key] = m
        return [best[k] for k in sorted(best)]


def run_benchmark(config: BenchConfig, *, progress: BenchProgress | None = None) -> BenchReport:
    """Measure copy bandwidth (on one host), then commflow and every peer of ``config`` on its
    sizes.

    A peer that is not installed, cannot run the operation, or fails adds a note instead of
    raising; commflow's own failure raises ``CommflowError``.
    """
    load = os.getloadavg()
    bandwidth = copy_bandwidth() if config.hosts == 1 else None
    measurements = _run(config, "commflow", config.commflow_algos, progress)
    notes = []
    for peer in config.peers:
        peer_module = module(peer)
        why = peer_module.missing() or peer_module.unsupported(
            config.collective, dtype_of(config.dtype), config.op
        )
        if why:
            notes.append(f"{peer} skipped: {why}")
            continue
        try:
            measurements += _run(config, peer, (PEER_ALGO,), progress)
        except CommflowError as error:
            notes.append(f"{peer} failed: {error}")
    return BenchReport(
        config=config,
        measurements=measurements,
        copy_bandwidth=bandwidth,
        load=load,
        bound=None if bandwidth is None else
        staged_busbw_bound(config.collective, config.nranks, bandwidth),
        notes=notes,
    )


def _run(
    config: BenchConfig, impl: str, algos: tuple[str, ...], progress: BenchProgress | None
) -> list[Measurement]:
    spec = RunSpec(
        impl=impl,
        collective=config.collective.value,
        algos=tuple(str(Path(a).resolve()) if is_program_file(a) else a for a in algos),
        blocks=config.blocks,
        dtype=config.dtype,
        op=config.op,
        root=config.root,
        warmup=config.warmup,
        iters=config.iters,
        small_iters=config.small_iters,  # type: ignore[arg-type]
        timeout=config.timeout,
        seed=secrets.randbits(32),
        hosts=config.hosts if impl == "commflow" else 1,
    )
    total = len(config.blocks)
    report = None if progress is None else (lambda done: progress(impl, done, total))
    return run_impl(spec, config.nranks, progress=report)
