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


def precondition(
    collective: Collective, nranks: int, chunk_factor: int, root: int | None = None
) -> dict[tuple[int, str, int], Element]:
    """Initial chunk values: ``{(rank, "input", index): Element}`` (absent chunks are empty)."""
    n, cf = nranks, chunk_factor
    shape = buffer_shape(collective, n, cf)
    init: dict[tuple[int, str, int], Element] = {}
    for r in range(n):
        if collective.rooted and collective in (Collective.BROADCAST, Collective.SCATTER) \
                and r != root:
            continue
        for i in range(shape.input):
            if collective is Collective.ALLTOALL:
                index = r * n * cf + i
            elif collective in (Collective.ALLGATHER, Collective.GATHER):
                index = r * cf + i
            else:
                index = i
            init[(r, "input", i)] = Element(index, 1 << r)
    return init


def postcondition(
    collective: Collective, nranks: int, chunk_factor: int, root: int | None = None
) -> dict[tuple[int, str, int], Element]:
    """Required final chunk values: ``{(rank, "output", index): Element}``."""
    n, cf = nranks, chunk_factor
    everyone = (1 << n) - 1
    post: dict[tuple[int, str, int], Element] = {}
    for r in range(n):
        if collective in (Collective.REDUCE, Collective.GATHER) and r != root:
            continue
        if collective is Collective.ALLREDUCE or collective is Collective.REDUCE:
            for i in range(cf):
                post[(r, "output", i)] = Element(i, everyone)
        elif collective is Collective.BROADCAST:
            for i in range(cf):
                post[(r, "output", i)] = Element(i, 1 << root)
        elif collective in (Collective.ALLGATHER, Collective.GATHER):
            for i in range(n * cf):
                post[(r, "output", i)] = Element(i, 1 << (i // cf))
        elif collective is Collective.REDUCESCATTER:
            for k in range(cf):
                post[(r, "output", k)] = Element(r * cf + k, everyone)
        elif collective is Collective.SCATTER:
            for k in range(cf):
                post[(r, "output", k)] = Element(r * cf + k, 1 << root)
        else:
            for i in range(n * cf):
                src, k = divmod(i, cf)
                post[(r, "output", i)] = Element(src * n * cf + r * cf + k, 1 << src)
    return post


def check_root(collective: Collective, nranks: int, root: int | None) -> int | None:
    """Validate ``root`` for ``collective``: required in range for rooted ones, else ``None``."""
    if not collective.rooted:
        return None
    if root is None:
        return 0
    if not 0 <= root < nranks:
        raise CommflowError(f"{collective.value}: root {root} is outside ranks 0..{nranks - 1}")
    return root
