"""Ring packing: weighted Hamiltonian cycles over the logical edges, run as rings side by side.

A ring over cycle ``c`` carrying a share ``y_c`` of every rank's data puts ``y_c`` of each of
``p - 1`` shards on each of its hops (allgather, reduce-scatter; allreduce twice), so the rings
take ``(p - 1) * max over links l of sum_c y_c * seconds_c[l]`` per byte of each rank's data.
Minimising that is the tree packing's LP with one group and cycles for trees
(:func:`~commflow.synth.trees.master_lp`): column generation prices the edges with the LP's
duals and adds the cheapest Hamiltonian cycle under them (:mod:`commflow.synth.hamilton`,
exact) until none is cheaper than the LP's dual. Where cycles can load every link to its
bandwidth, rings reach the cut bound: DGX-1's NVLinks are six directed cycles, and there six
equal rings reach what the tree packing reaches. Rings then lower to MSCCL-family runtimes
with one threadblock per ring, every forward fused with its receive, and no pipeline to fill
beyond the ring's own steps (:func:`commflow.synth.synthesize_for` compares them with the tree
programs on the target). The shares are made whole (each cycle run as that many equal rings,
NCCL's channels, :mod:`commflow.algorithms.multi_ring`) by
:func:`~commflow.synth.rounding.whole_counts`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commflow.algorithms import multi_ring
from commflow.collectives import Collective, parse_collective
from commflow.errors import AlgorithmError
from commflow.ir import Program
from commflow.synth.hamilton import MOST_RANKS, cheapest_cycle
from commflow.synth.links import LogicalEdges, logical_edges
from commflow.synth.rounding import whole_counts
from commflow.synth.trees import master_lp
from commflow.topology.graph import Topology

COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
"""What rings run (:mod:`commflow.algorithms.multi_ring`)."""

MOST_RINGS = 16
"""Most rings (whole shares) a packing is rounded to; MSCCL keeps 32 channels."""

SAMPLES = 64
"""Cycles priced at randomly perturbed link prices after the column generation: an optimum
of few whole rings (DGX-1: six equal ones) often needs cycles the optimal fractional packing
does not use."""

_TOLERANCE = 1e-9
"""Relative reduced cost below which a cycle counts as improving."""


@dataclass(frozen=True)
class RingPacking:
    """Hamiltonian cycles with the share of the data each carries."""

    cycles: tuple[tuple[int, ...], ...]
    """Every cycle found, as rank orders from rank 0: the column generation's and
    :data:`SAMPLES` more, cheapest under perturbed prices (for whole shares)."""
    weights: np.ndarray
    """Share of every rank's data on each cycle in the optimum (summing to 1; most are 0)."""
    loads: np.ndarray
    """Link x cycle: the relative seconds per byte each cycle's hops put on each link."""
    seconds_per_byte: float
    """Seconds per byte of each rank's data the rings take together (allgather)."""


def pack_rings(edges: LogicalEdges, *, max_rounds: int = 500) -> RingPacking | None:
    """The optimal fractional packing of directed Hamiltonian cycles of ``edges`` (see the
    module); ``None`` when the edges have no such cycle or more than
    :data:`~commflow.synth.hamilton.MOST_RANKS` ranks. Raises ``AlgorithmError`` when the LP
    fails or does not converge in ``max_rounds`` rounds."""
    n = edges.nranks
    if n > MOST_RANKS:
        return None
    scale = 1.0 / edges.seconds.max()
    seconds = edges.seconds.toarray() * scale
    ids = np.full((n, n), -1, dtype=np.int64)
    ids[edges.src, edges.dst] = np.arange(len(edges.src))

    def cheapest(cost: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
        dense = np.full((n, n), np.inf)
        dense[edges.src, edges.dst] = cost
        return cheapest_cycle(dense)

    first = cheapest(np.ones(len(edges.src)))
    if first is None:
        return None
    columns = [(0, first[1], _load(seconds, ids, first[1]))]
    for _ in range(max_rounds):
        value, y, prices, mu = master_lp(columns, [0])
        price, cycle = cheapest(seconds @ prices)
        if price >= mu[0] - _TOLERANCE * max(abs(mu[0]), value):
            found = {c[1]: float(w) if w > 1e-12 else 0.0 for c, w in zip(columns, y,
                                                                          strict=True)}
            rng = np.random.default_rng(0)
            for _ in range(SAMPLES):
                found.setdefault(cheapest(seconds @ (prices * rng.uniform(0.5, 1.5, len(prices))
                                                     + rng.uniform(0, 1e-3, len(prices))))[1],
                                 0.0)
            loads = np.stack([_load(seconds, ids, c) for c in found], axis=1)
            return RingPacking(tuple(found), np.array(list(found.values())), loads,
                               (n - 1) * value / scale)
        columns.append((0, cycle, _load(seconds, ids, cycle)))
    raise AlgorithmError(f"ring packing on {edges.topology.name} did not converge in "
                         f"{max_rounds} rounds; raise max_rounds")


def _load(seconds: np.ndarray, ids: np.ndarray, cycle: tuple[int, ...]) -> np.ndarray:
    """Scaled seconds per byte the hops of ``cycle`` put on each link."""
    hops = ids[list(cycle), list(cycle[1:] + cycle[:1])]
    return seconds[hops].sum(axis=0)


def ring_orders(topology: Topology) -> list[tuple[int, ...]] | None:
    """The rank orders of the rings :func:`pack_rings` gives ``topology``, each cycle repeated
    by its whole share of at most :data:`MOST_RINGS` equal rings
    (:func:`~commflow.synth.rounding.whole_counts` over every cycle found); ``None`` where
    there is no packing."""
    packing = pack_rings(logical_edges(topology))
    if packing is None:
        return None
    loads = packing.loads[packing.loads.any(axis=1)]
    loads = loads / (loads @ packing.weights).max()
    counts, _ = whole_counts(loads, np.zeros(len(packing.cycles), dtype=np.int64),
                             packing.weights, units=range(1, MOST_RINGS + 1))
    return [c for c, k in zip(packing.cycles, counts.astype(int).tolist(), strict=True)
            for _ in range(k)]


def ring_program(collective: Collective | str, topology: Topology, *, chunks: int = 1,
                 orders: list[tuple[int, ...]] | None = None) -> Program | None:
    """Rings along ``orders`` (default: :func:`ring_orders`), each pipelined in ``chunks``
    chunks (:mod:`commflow.algorithms.multi_ring`); ``None`` for collectives rings do not
    run and where there is no packing. Raises ``AlgorithmError`` for ``chunks`` < 1."""
    kind = parse_collective(collective)
    if kind not in COLLECTIVES:
        return None
    orders = ring_orders(topology) if orders is None else orders
    if orders is None:
        return None
    program = multi_ring.generate(kind, topology.nranks, chunks=chunks, orders=orders)
    params = {**dict(program.params), "topology": topology.name, "cycles": len(set(orders)),
              "packing": "cycles"}
    return Program(f"{kind.value}/synth_rings", program.collective, program.nranks,
                   program.chunk_factor, program.root, program.participants, program.table,
                   tuple(sorted(params.items())))
