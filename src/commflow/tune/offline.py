"""Offline tuning: rank programs by the simulator at each size, and the table of winners.

:func:`rank` times candidate programs at one size; :func:`offline_table` ranks the registered
algorithms placed on a topology (:func:`commflow.algorithms.build_for`) at each size of a
sweep and keeps, per collective, the winner of each size as a rule covering the sizes above the
previous one: the first rule starts at 0 bytes, the last extends to every larger size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from commflow.algorithms import available, build_for
from commflow.collectives import Collective, parse_collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.ir import Program
from commflow.sim import simulate
from commflow.topology import fingerprint
from commflow.topology.graph import Topology
from commflow.tune.fastest import Candidate
from commflow.tuning_table import Rule, TuningTable

_LARGEST = 2**63 - 1


@dataclass(frozen=True)
class Ranked:
    """One candidate's simulated time at one size."""

    method: str
    """The candidate's name (registered algorithm, ``bandwidth``, ``latency``)."""
    seconds: float
    """Simulated time of the collective."""
    program: Program
    """The program timed."""


def registered(collective: Collective | str, topology: Topology, *,
               root: int | None = None) -> list[Candidate]:
    """Every registered algorithm of ``collective`` that applies to ``topology``'s ranks,
    placed on it (a ring along the fastest links, hierarchical by box)."""
    kind = parse_collective(collective)
    extra = {"root": root or 0} if kind.rooted else {}
    found = []
    for algorithm in available(kind):
        try:
            found.append(Candidate(algorithm.name, build_for(kind, algorithm.name, topology,
                                                             **extra)))
        except AlgorithmError:  # e.g. a power-of-two algorithm on 6 ranks
            continue
    return found


def rank(candidates: Iterable[Candidate], topology: Topology, size: float, *,
         model: str = "alphabeta") -> list[Ranked]:
    """The candidates' simulated times for a ``size``-byte collective, fastest first (ties:
    the order given). Raises ``SimulationError`` for a bad size or model."""
    timed = [Ranked(c.method, simulate(c.program, topology, size, model=model).time, c.program)
             for c in candidates]
    return sorted(timed, key=lambda r: r.seconds)


def offline_table(collectives: Sequence[Collective | str], topology: Topology,
                  sizes: Sequence[int], *, model: str = "alphabeta") -> TuningTable:
    """The fastest registered algorithm per size range for each of ``collectives`` on
    ``topology`` (see the module docstring), simulated with ``model`` at ``sizes`` (bytes,
    increasing). Raises ``CommflowError`` for an empty or unsorted sweep, or a collective no
    registered algorithm covers on these ranks."""
    if not sizes or any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise CommflowError(f"offline tuning needs increasing sizes, got {list(sizes)}")
    rules: list[Rule] = []
    for collective in collectives:
        kind = parse_collective(collective)
        candidates = registered(kind, topology)
        if not candidates:
            raise CommflowError(f"no registered {kind.value} algorithm runs on "
                                f"{topology.nranks} ranks")
        winners = [rank(candidates, topology, size, model=model)[0] for size in sizes]
        low = 0
        for i, (size, best) in enumerate(zip(sizes, winners, strict=True)):
            last = i + 1 == len(sizes)
            if not last and winners[i + 1].method == best.method:
                continue
            rules.append(Rule(collective=kind, nranks=topology.nranks, min_bytes=low,
                              max_bytes=_LARGEST if last else size, algo=best.method,
                              time_us=best.seconds * 1e6))
            low = size + 1
    return TuningTable(fingerprint=fingerprint(topology), topology=topology.name, model=model,
                       rules=tuple(rules))
