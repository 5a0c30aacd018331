"""One rank's buffers for one benchmarked operation, with inputs whose results are exact.

Rank ``r`` puts the value ``f(r, g)`` at global element index ``g`` of the collective's logical
array (see the table of :mod:`commflow.collectives`): small integers, also for floating-point
types, so every sum, product, min, max and average is exact whatever the reduction order, and
the expected output of every rank is computed here without running any implementation:

* ``sum``, ``avg``, ``min``, ``max``: ``f(r, g) = (r + g) mod n + 1 + n (g mod 3)`` (the sum
  over ranks is ``n(n+1)/2 + n^2 (g mod 3)``, so the average is a multiple of 1/2);
* ``prod``: ``f(r, g) = 2`` if ``(r + g) mod 3 = 0`` else ``1`` (products are powers of two);
* ``bool``: ``f(r, g) = ((r + g) mod 3 = 0)``; ``sum``/``max`` are logical or, ``prod``/``min``
  logical and.

``f`` is periodic in ``g`` with period ``3n``, so arrays are tiled from one period. Integer
types wrap around as in C, identically in every implementation.

Placement follows nccl-tests: out-of-place uses separate send and receive buffers; in-place
uses one buffer, the send buffer being this rank's block of the receive buffer (allgather,
gather) or the receive buffer this rank's block of the send buffer (reduce-scatter, scatter).
Before every iteration :meth:`Case.prepare` restores the inputs and fills every element this
rank must receive with a value different from the expected one, so the check after the timed
loop proves that the last iteration delivered every element.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commflow.collectives import Collective, buffer_shape
from commflow.errors import CommflowError

_FLAT = (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE)


@dataclass(frozen=True, kw_only=True)
class CaseSpec:
    """What one rank benchmarks: a collective at one size and placement."""

    collective: Collective
    """The collective."""
    nranks: int
    """Number of ranks."""
    rank: int
    """This rank."""
    block: int
    """Elements per block: the whole array for allreduce/broadcast/reduce, else one rank's."""
    dtype: np.dtype
    """Element type."""
    op: str
    """Reduction operator (``sum``, ``prod``, ``min``, ``max``, ``avg``)."""
    root: int
    """Root rank of rooted collectives."""
    inplace: bool
    """One buffer (nccl-tests in-place) instead of separate send and receive buffers."""


def block_elements(collective: Collective, nranks: int, size: int, itemsize: int) -> int:
    """Elements per block for a requested ``size`` in bytes (nccl-tests' size convention),
    rounded down to whole elements (and blocks), at least 1."""
    per = itemsize if collective in _FLAT else itemsize * nranks
    return max(1, size // per)


def size_bytes(collective: Collective, nranks: int, block: int, itemsize: int) -> int:
    """The ``size`` in bytes that blocks of ``block`` elements make (nccl-tests convention)."""
    return block * itemsize * (1 if collective in _FLAT else nranks)


def _pattern(spec: CaseSpec, rank: int, start: int) -> np.ndarray:
    """``f(rank, start + k)`` for one period ``k = 0 .. 3n-1``, as int64."""
    g = start + np.arange(3 * spec.nranks, dtype=np.int64)
    hit = ((rank + g) % 3 == 0).astype(np.int64)
    if spec.dtype == np.bool_:
        return hit
    if spec.op == "prod":
        return hit + 1
    return (rank + g) % spec.nranks + 1 + g % 3


def values(spec: CaseSpec, rank: int, start: int, count: int) -> np.ndarray:
    """``f(rank, g)`` for ``g = start .. start+count-1``, in ``spec.dtype``."""
    return np.resize(_pattern(spec, rank, start), count).astype(spec.dtype)


def reduced(spec: CaseSpec, start: int, count: int) -> np.ndarray:
    """The reduction over all ranks of ``f(r, g)`` for ``g = start .. start+count-1``."""
    acc = _pattern(spec, 0, start).astype(spec.dtype)
    for r in range(1, spec.nranks):
        acc = _combine(spec.op, acc, _pattern(spec, r, start).astype(spec.dtype))
    if spec.op == "avg":
        acc = (acc / spec.nranks).astype(spec.dtype)
    return np.resize(acc, count)


def _combine(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype == np.bool_:
        return (a | b) if op in ("sum", "max") else (a & b)
    ufunc = {
        "sum": np.add,
        "avg": np.add,
        "prod": np.multiply,
        "min": np.minimum,
        "max": np.maximum,
    }[op]
    return ufunc(a, b, dtype=a.dtype)


def wrong_values(expected: np.ndarray) -> np.ndarray:
    """Values that differ from ``expected`` everywhere."""
    if expected.dtype == np.bool_:
        return ~expected
    return expected + np.array(1, expected.dtype)


def _filled(count: int, dtype: np.dtype, fill: np.ndarray | None) -> np.ndarray:
    """A receive buffer of ``count`` elements holding ``fill`` (zeros when ``None``)."""
    return np.zeros(count, dtype) if fill is None else fill.copy()


class Case:
    """One rank's send and receive buffers, the image they are reset to before every
    iteration, and the expected result."""

    def __init__(self, spec: CaseSpec) -> None:
        coll, n, r, c = spec.collective, spec.nranks, spec.rank, spec.block
        if not 0 <= spec.root < n:
            raise CommflowError(f"root {spec.root} is outside ranks 0..{n - 1}")
        shape = buffer_shape(coll, n, 1)
        self.spec = spec
        self.expected = self._expected(spec)
        wrong = None if self.expected is None else wrong_values(self.expected)
        send = self._input(spec, shape.input * c)
        own = slice(r * c, (r + 1) * c)
        if not spec.inplace:
            buffer = _filled(shape.output * c, spec.dtype, wrong)
            self.send, self.recv = send, buffer
        elif coll in (Collective.ALLGATHER, Collective.GATHER):
            buffer = _filled(shape.output * c, spec.dtype, wrong)
            buffer[own] = send
            self.send, self.recv = buffer[own], buffer
        elif coll in (Collective.REDUCESCATTER, Collective.SCATTER):
            buffer = send
            if coll is Collective.SCATTER and r != spec.root:
                buffer[own] = wrong
            self.send, self.recv = buffer, buffer[own]
        else:
            buffer = send
            if coll is Collective.BROADCAST and r != spec.root:
                buffer[...] = wrong
            self.send = self.recv = buffer
        self._buffer = buffer
        self._image = buffer.copy()

    @staticmethod
    def _input(spec: CaseSpec, count: int) -> np.ndarray:
        coll, r, c = spec.collective, spec.rank, spec.block
        if coll in (Collective.BROADCAST, Collective.SCATTER):
            return values(spec, spec.root, 0, count)
        if coll in (Collective.ALLGATHER, Collective.GATHER):
            return values(spec, r, r * c, c)
        return values(spec, r, 0, count)

    @staticmethod
    def _expected(spec: CaseSpec) -> np.ndarray | None:
        """What this rank's receive buffer must hold, ``None`` where it receives nothing."""
        coll, n, r, c, root = spec.collective, spec.nranks, spec.rank, spec.block, spec.root
        if coll in (Collective.REDUCE, Collective.GATHER) and r != root:
            return None
        if coll in (Collective.ALLREDUCE, Collective.REDUCE):
            return reduced(spec, 0, c)
        if coll is Collective.REDUCESCATTER:
            return reduced(spec, r * c, c)
        if coll is Collective.BROADCAST:
            return values(spec, root, 0, c)
        if coll is Collective.SCATTER:
            return values(spec, root, r * c, c)
        if coll is Collective.ALLTOALL:
            return np.concatenate([values(spec, j, r * c, c) for j in range(n)])
        return np.concatenate([values(spec, j, j * c, c) for j in range(n)])

    def prepare(self) -> None:
        """Restore the inputs and refill what this rank must receive with wrong values."""
        np.copyto(self._buffer, self._image)

    def wrong(self) -> int:
        """Number of elements of this rank's result that differ from the expected values."""
        if self.expected is None:
            return 0
        return int(np.count_nonzero(self.recv != self.expected))
