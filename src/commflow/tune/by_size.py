"""A program set by size: the fastest candidate (synthesized or registered) for each size
range, as MSCCL runtimes load several algorithms with ``minBytes``/``maxBytes``.

Every candidate of :func:`commflow.tune.fastest.candidates` (the bandwidth synthesis at 1,
2, 4, ... pieces, the step schedule, every registered algorithm) is simulated at each tuned
size; the fastest wins there (ties: the first generated). Consecutive sizes with the same
winner form one range, from just above the previous range to its largest tuned size (the
first from 0 bytes, the last to ``2**62 - 1``, the largest size MSCCL sizes scratch for).
Since the registered algorithms are candidates, the set is never slower in simulation than
the best of them at any tuned size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from commflow.collectives import Collective, parse_collective
from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.sim import simulate
from commflow.topology.graph import Topology
from commflow.tune.fastest import DEFAULT_PIECES, candidates

LARGEST = 2**62 - 1
"""Upper end of the last range (bytes)."""


@dataclass(frozen=True)
class SizeRange:
    """The program to run for sizes ``min_bytes..max_bytes`` (inclusive)."""

    min_bytes: int
    max_bytes: int
    method: str
    """The winning candidate's method (``bandwidth``, ``latency`` or an algorithm's name)."""
    program: Program
    seconds: float
    """Its simulated time at the largest tuned size of the range."""


def program_set(collective: Collective | str, topology: Topology, sizes: Sequence[int], *,
                pieces: int = DEFAULT_PIECES, model: str = "alphabeta",
                root: int | None = None) -> list[SizeRange]:
    """The fastest candidate per size range for ``collective`` on ``topology`` at ``sizes``
    (bytes, increasing); see the module docstring.

    Raises ``CommflowError`` for no sizes or unsorted ones.
    """
    sizes = [int(s) for s in sizes]
    if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 1:
        raise CommflowError(f"program_set needs increasing sizes >= 1 byte, got {sizes}")
    kind = parse_collective(collective)
    found = list(candidates(kind, topology, pieces=pieces, root=root))
    winners = []
    for size in sizes:
        times = [simulate(c.program, topology, size, model=model).time for c in found]
        best = min(range(len(found)), key=lambda k: (times[k], k))
        winners.append((best, times[best]))
    ranges: list[SizeRange] = []
    low = 0
    for j, (size, (best, seconds)) in enumerate(zip(sizes, winners, strict=True)):
        last = j == len(sizes) - 1
        if not last and winners[j + 1][0] == best:
            continue
        ranges.append(SizeRange(low, LARGEST if last else size, found[best].method,
                                found[best].program, seconds))
        low = size + 1
    return ranges
