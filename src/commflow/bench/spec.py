"""What the parent tells the ranks of one implementation to run, as a JSON file (nothing is
pickled): read by ``python -m commflow.bench.worker SPEC.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from commflow.bench.cases import size_bytes
from commflow.collectives import parse_collective
from commflow.runtime import dtype_of

SMALL_BYTES = 64 * 1024
"""Sizes (bytes, nccl-tests' convention) up to and including this run ``small_iters`` timed
rounds instead of ``iters``, as the OSU micro-benchmarks run more iterations for small
messages: their calls take microseconds, and the host's scheduling decides the median of a
few dozen."""


def timed_rounds(size: int, iters: int, small_iters: int) -> int:
    """Timed rounds for ``size`` bytes: ``small_iters`` up to :data:`SMALL_BYTES`, else
    ``iters``."""
    return small_iters if size <= SMALL_BYTES else iters


def emulated_host(rank: int, nranks: int, hosts: int) -> str:
    """The ``COMMFLOW_HOST`` of ``rank`` when ``nranks`` ranks are split into ``hosts``
    emulated hosts of consecutive ranks (as launchers number the ranks of a node)."""
    return f"bench{rank * hosts // nranks}"


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What the ranks of one implementation run, as the parent writes it for them."""

    impl: str
    """Implementation name (``commflow``, ``gloo``, ``mpi``)."""
    collective: str
    """Collective name."""
    algos: tuple[str, ...]
    """Algorithms to run, in order (peers: ``("default",)``); program files by absolute
    path."""
    blocks: tuple[int, ...]
    """Elements per block, one entry per size (see :func:`cases.block_elements`)."""
    dtype: str
    """Element type name."""
    op: str
    """Reduction operator."""
    root: int
    """Root of rooted collectives."""
    warmup: int
    """Untimed iterations before the timed ones, per size and placement."""
    iters: int
    """Timed iterations per size and placement above :data:`SMALL_BYTES`."""
    small_iters: int
    """Timed iterations per size and placement up to :data:`SMALL_BYTES`."""
    timeout: float
    """Seconds any wait of the implementation may take."""
    seed: int = 0
    """Seeds the orders in which the algorithms take turns (the parent draws one per run, so
    that runs, sizes and placements each take other orders)."""
    hosts: int = 1
    """Emulated hosts the ranks are split into (consecutive ranks, :func:`emulated_host`);
    between hosts commflow's messages take the engine transport."""
    corrupt_rank: int | None = None
    """Test hook: this rank spoils one element of each result before the check."""

    def rounds(self, nranks: int, block: int) -> int:
        """Timed rounds of blocks of ``block`` elements on ``nranks`` ranks
        (:func:`timed_rounds` of their size)."""
        size = size_bytes(parse_collective(self.collective), nranks, block,
                          dtype_of(self.dtype).itemsize)
        return timed_rounds(size, self.iters, self.small_iters)

    def save(self, path: Path) -> None:
        """Write the spec as JSON to ``path``."""
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        """Read a spec written by :meth:`save`."""
        fields = json.loads(Path(path).read_text())
        return cls(**{**fields, "algos": tuple(fields["algos"]), "blocks": tuple(fields["blocks"])})
