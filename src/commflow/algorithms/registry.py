"""The algorithm registry: generators of programs, keyed ``"collective/name"``.

A generator is called as ``generator(collective, nranks, chunks=..., channels=..., root=...,
**extra)`` and returns a :class:`~commflow.ir.Program`; it raises ``AlgorithmError`` when it
does not apply to the arguments (saying why and what would).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from commflow.collectives import Collective, check_root, parse_collective
from commflow.errors import AlgorithmError
from commflow.ir import Program
from commflow.ir.transform import relabel

Generator = Callable[..., Program]


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm for one collective.

    ``params`` names the extra keyword parameters the generator accepts beyond ``chunks``,
    ``channels`` and ``root`` (e.g. ``("box",)``); ``summary`` is one line for listings, with
    the cost formula where there is one.
    """

    collective: Collective
    name: str
    generator: Generator
    summary: str
    params: tuple[str, ...] = ()
    in_network: bool = False
    """Whether its programs have switch participants (they aggregate in the network): they
    verify and simulate, but neither the live runtime nor MSCCL runs them."""

    @property
    def key(self) -> str:
        """Registry key ``"collective/name"``."""
        return f"{self.collective.value}/{self.name}"


_REGISTRY: dict[tuple[Collective, str], Algorithm] = {}


def register(collectives: Iterable[Collective], name: str, generator: Generator, summary: str,
             params: tuple[str, ...] = (), *, in_network: bool = False) -> None:
    """Register ``generator`` as algorithm ``name`` for each of ``collectives``."""
    for collective in collectives:
        key = (collective, name)
        if key in _REGISTRY:
            raise AlgorithmError(f"algorithm {collective.value}/{name} registered twice")
        _REGISTRY[key] = Algorithm(collective, name, generator, summary, params, in_network)


def available(collective: Collective | str | None = None, *,
              in_network: bool = False) -> list[Algorithm]:
    """Registered algorithms, for one collective or all, sorted by key; those that aggregate
    in the network (:attr:`Algorithm.in_network`) only with ``in_network``."""
    coll = None if collective is None else parse_collective(collective)
    return sorted((a for a in _REGISTRY.values() if (coll is None or a.collective is coll)
                   and (in_network or not a.in_network)), key=lambda a: a.key)


def get(collective: Collective | str, name: str) -> Algorithm:
    """The algorithm ``name`` for ``collective``; ``AlgorithmError`` listing the known ones."""
    coll = parse_collective(collective)
    try:
        return _REGISTRY[(coll, name)]
    except KeyError:
        known = ", ".join(a.name for a in available(coll)) or "none"
        raise AlgorithmError(
            f"no algorithm {name!r} for {coll.value}; available: {known}") from None


def build(collective: Collective | str, name: str, nranks: int, *, chunks: int = 1,
          channels: int = 1, root: int | None = None, order: Sequence[int] | None = None,
          **params: object) -> Program:
    """Generate the program of algorithm ``name`` for ``collective`` on ``nranks`` ranks.

    ``chunks`` pipelines (each block is cut into that many chunks sent one after another);
    ``channels`` splits the data over that many independent channels; ``order`` lays the
    algorithm out with rank ``order[i]`` in the place of rank ``i`` (e.g. a ring along
    NVLinks, see :func:`commflow.topology.ring_order`). Raises ``AlgorithmError`` when the
    algorithm is unknown or does not apply, ``ProgramError`` for a bad ``order``.
    """
    algorithm = get(collective, name)
    if nranks < 1:
        raise AlgorithmError(f"{algorithm.key}: nranks must be >= 1, got {nranks}")
    if chunks < 1 or channels < 1:
        raise AlgorithmError(f"{algorithm.key}: chunks and channels must be >= 1")
    unknown = set(params) - set(algorithm.params)
    if unknown:
        raise AlgorithmError(
            f"{algorithm.key}: unknown parameter(s) {sorted(unknown)}; it takes "
            f"{', '.join(('chunks', 'channels', 'root', 'order', *algorithm.params))}")
    root = check_root(algorithm.collective, nranks, root)
    if order is None or list(order) == list(range(nranks)):
        return algorithm.generator(algorithm.collective, nranks, chunks=chunks,
                                   channels=channels, root=root, **params)
    if sorted(order) != list(range(nranks)):
        raise AlgorithmError(f"{algorithm.key}: order must be a permutation of 0..{nranks - 1}, "
                             f"got {list(order)}")
    position = None if root is None else list(order).index(root)
    program = algorithm.generator(algorithm.collective, nranks, chunks=chunks,
                                  channels=channels, root=position, **params)
    return relabel(program, order)
