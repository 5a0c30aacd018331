"""The collectives: kinds, chunk pre/postconditions, size conventions and busbw factors.

Chunk layout follows MSCCL: a program runs on ``nranks`` ranks with ``chunk_factor`` chunks
per block. Buffers per rank, in chunks:

============== ========================= ========================= =============
collective     input                     output                    ``size`` is
============== ========================= ========================= =============
allreduce      cf                        cf                        the array
broadcast      cf (root's counts)        cf                        the array
reduce         cf                        cf (root's counts)        the array
allgather      cf                        n*cf                      output
gather         cf                        n*cf (root's counts)      output
reducescatter  n*cf                      cf                        input
scatter        n*cf (root's counts)      cf                        input
alltoall       n*cf (block j -> rank j)  n*cf (block i <- rank i)  input
============== ========================= ========================= =============

A chunk's symbolic value is an :class:`Element` index plus the set of ranks whose
contributions it holds. Sizes and busbw factors follow nccl-tests (see REFERENCES.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from commflow.errors import CommflowError


class Collective(StrEnum):
    """A collective operation."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    ALLTOALL = "alltoall"

    @property
    def rooted(self) -> bool:
        """Whether the collective has a root rank."""
        return self in (Collective.BROADCAST, Collective.REDUCE, Collective.GATHER,
                        Collective.SCATTER)

    @property
    def reduces(self) -> bool:
        """Whether the collective combines contributions with a reduction operator."""
        return self in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE)


_ALIASES = {"reduce_scatter": "reducescatter", "reduce-scatter": "reducescatter",
            "all_reduce": "allreduce", "all_gather": "allgather", "all_to_all": "alltoall",
            "all-reduce": "allreduce", "all-gather": "allgather", "all-to-all": "alltoall"}


def parse_collective(name: str | Collective) -> Collective:
    """Return the collective named ``name`` (``"allreduce"``, ``"reduce_scatter"``, ...).

    Raises ``CommflowError`` listing the known names when ``name`` is none of them.
    """
    if isinstance(name, Collective):
        return name
    key = _ALIASES.get(name.lower(), name.lower())
    try:
        return Collective(key)
    except ValueError:
        known = ", ".join(c.value for c in Collective)
        raise CommflowError(f"unknown collective {name!r}; known: {known}") from None


@dataclass(frozen=True)
class BufferShape:
    """Chunk counts of one rank's input and output buffers."""

    input: int
    output: int


def buffer_shape(collective: Collective, nranks: int, chunk_factor: int) -> BufferShape:
    """Input and output chunk counts per rank (the table in the module docstring)."""
    n, cf = nranks, chunk_factor
    if collective in (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE):
        return BufferShape(cf, cf)
    if collective in (Collective.ALLGATHER, Collective.GATHER):
        return BufferShape(cf, n * cf)
    if collective in (Collective.REDUCESCATTER, Collective.SCATTER):
        return BufferShape(n * cf, cf)
    return BufferShape(n * cf, n * cf)


def size_buffer(collective: Collective) -> str:
    """Which buffer, ``"input"`` or ``"output"``, holds ``size`` bytes (nccl-tests convention)."""
    if collective in (Collective.ALLGATHER, Collective.GATHER):
        return "output"
    return "input"


def chunk_bytes(collective: Collective, nranks: int, chunk_factor: int, size: float) -> float:
    """Bytes in one chunk of a program when the collective moves ``size`` bytes."""
    shape = buffer_shape(collective, nranks, chunk_factor)
    chunks = shape.output if size_buffer(collective) == "output" else shape.input
    return size / chunks


def busbw_factor(collective: Collective, nranks: int) -> float:
    """nccl-tests factor with ``busbw = algbw * factor``."""
    n = nranks
    if collective is Collective.ALLREDUCE:
        return 2 * (n - 1) / n
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        return 1.0
    return (n - 1) / n


@dataclass(frozen=True)
class Element:
    """Symbolic content of a chunk: which logical element, and whose contributions it holds.

    ``ranks`` is a bit mask (bit r set: rank r's contribution is included).
    """

    index: int
    ranks: int

    def describe(self) -> str:
        """Human-readable form, e.g. ``element 3 from ranks {0, 2}``."""
        members = [r for r in range(self.ranks.bit_length()) if self.ranks >> r & 1]
        return f"element {self.index} from ranks {{{', '.join(map(str, members))}}}"


class ChunkValues(NamedTuple):
    """Chunk values as parallel arrays (int64, one entry per chunk, ordered by rank, then
    index): chunk ``index`` of ``rank``'s buffer holds element ``element`` with the
    contribution of rank ``contributor``, or of every rank where ``contributor`` is -1."""

    rank: np.ndarray
    index: np.ndarray
    element: np.ndarray
    contributor: np.ndarray

    def as_dict(self, buffer: str, nranks: int) -> dict[tuple[int, str, int], Element]:
        """``{(rank, buffer, index): Element}``."""
        everyone = (1 << nranks) - 1
        return {(r, buffer, i): Element(e, everyone if c < 0 else 1 << c)
                for r, i, e, c in zip(self.rank.tolist(), self.index.tolist(),
                                      self.element.tolist(), self.contributor.tolist(),
                                      strict=True)}


def _per_rank(ranks: list[int], chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rank, index)`` of ``chunks`` chunks on each of ``ranks``."""
    return (np.repeat(np.asarray(ranks, dtype=np.int64), chunks),
            np.tile(np.arange(chunks, dtype=np.int64), len(ranks)))


def initial_chunks(
    collective: Collective, nranks: int, chunk_factor: int, root: int | None = None
) -> ChunkValues:
    """Initial input chunk values (absent chunks are empty), as arrays."""
    n, cf = nranks, chunk_factor
    rooted = collective.rooted and collective in (Collective.BROADCAST, Collective.SCATTER)
    ranks = ([] if root is None else [root]) if rooted else list(range(n))
    rank, i = _per_rank(ranks, buffer_shape(collective, n, cf).input)
    if collective is Collective.ALLTOALL:
        element = rank * n * cf + i
    elif collective in (Collective.ALLGATHER, Collective.GATHER):
        element = rank * cf + i
    else:
        element = i.copy()
    return ChunkValues(rank, i, element, rank.copy())


def final_chunks(
    collective: Collective, nranks: int, chunk_factor: int, root: int | None = None
) -> ChunkValues:
    """Required final output chunk values, as arrays."""
    n, cf = nranks, chunk_factor
    rooted = collective in (Collective.REDUCE, Collective.GATHER)
    ranks = ([] if root is None else [root]) if rooted else list(range(n))
    gathers = collective in (Collective.ALLGATHER, Collective.GATHER, Collective.ALLTOALL)
    rank, i = _per_rank(ranks, n * cf if gathers else cf)
    if collective in (Collective.ALLREDUCE, Collective.REDUCE):
        return ChunkValues(rank, i, i.copy(), np.full_like(i, -1))
    if collective is Collective.BROADCAST:
        return ChunkValues(rank, i, i.copy(), np.full_like(i, root))
    if collective in (Collective.ALLGATHER, Collective.GATHER):
        return ChunkValues(rank, i, i.copy(), i // cf)
    if collective is Collective.REDUCESCATTER:
        return ChunkValues(rank, i, rank * cf + i, np.full_like(i, -1))
    if collective is Collective.SCATTER:
        return ChunkValues(rank, i, rank * cf + i, np.full_like(i, root))
    src, k = np.divmod(i, cf)
    return ChunkValues(rank, i, src * n * cf + rank * cf + k, src)


def precondition(
    collective: Collective, nranks: int, chunk_factor: int, root: int | None = None
) -> dict[tuple[int, str, int], Element]:
    """Initial chunk values: ``{(rank, "input", index): Element}`` (absent chunks are empty)."""
    return initial_chunks(collective, nranks, chunk_factor, root).as_dict("input", nranks)


def postcondition(
    collective: Collective, nranks: int, chunk_factor: int, root: int | None = None
) -> dict[tuple[int, str, int], Element]:
    """Required final chunk values: ``{(rank, "output", index): Element}``."""
    return final_chunks(collective, nranks, chunk_factor, root).as_dict("output", nranks)


def check_root(collective: Collective, nranks: int, root: int | None) -> int | None:
    """Validate ``root`` for ``collective``: required in range for rooted ones, else ``None``."""
    if not collective.rooted:
        return None
    if root is None:
        return 0
    if not 0 <= root < nranks:
        raise CommflowError(f"{collective.value}: root {root} is outside ranks 0..{nranks - 1}")
    return root
