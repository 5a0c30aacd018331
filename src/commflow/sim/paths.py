"""Mapping a program's transfers onto a topology's links.

Participants are placed on topology nodes (:func:`place`). Every send then names a
*connection*: the ordered pair (sending participant, receiving participant). A connection
between nodes ``u != v`` follows all routes of :func:`commflow.topology.routing.weighted_routes`
at once, its traffic split across them by their fractions: evenly over the equal-cost shortest
routes (packet spraying: a link on ``k`` of ``m`` routes carries ``k/m`` of every message)
unless a maximum flow through switches gives the pair more bandwidth. A connection inside one
node uses no link and costs nothing. The latency of a
connection is the sum of the link latencies of one route, averaged over its routes (they are
equal-cost in hops, and equal in seconds whenever links on the same level share a latency).

:class:`Connections` holds the per-connection incidence as CSR arrays (``link``, ``fraction``
per entry) and expands it for any set of sends with numpy, so both models share it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from commflow.errors import SimulationError, TopologyError
from commflow.ir import Op, ParticipantKind, Program
from commflow.sim.kernels import number_connections
from commflow.topology.graph import NodeKind, Topology
from commflow.topology.routing import prefetch_routes, weighted_routes


def gather_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The index ranges ``lo[i]:hi[i]``, concatenated.

    Returns ``(seg_ptr, entry)``: range ``i`` is ``entry[seg_ptr[i]:seg_ptr[i+1]]``.
    """
    lengths = hi - lo
    seg_ptr = np.zeros(len(lo) + 1, dtype=np.int64)
    np.cumsum(lengths, out=seg_ptr[1:])
    entry = np.arange(seg_ptr[-1], dtype=np.int64) + np.repeat(lo - seg_ptr[:-1], lengths)
    return seg_ptr, entry


def gather_segments(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries of CSR rows ``rows`` (repeats allowed), as :func:`gather_ranges` returns them."""
    return gather_ranges(ptr[rows], ptr[rows + 1])


def segment_max(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Maximum of each segment ``values[ptr[i]:ptr[i+1]]`` (0 for an empty segment)."""
    out = np.zeros(len(ptr) - 1, dtype=np.float64)
    nonempty = np.flatnonzero(ptr[1:] > ptr[:-1])
    if len(nonempty):
        out[nonempty] = np.maximum.reduceat(values, ptr[nonempty])
    return out


def place(program: Program, topology: Topology, placement: Sequence[int] | None) -> np.ndarray:
    """Topology node of every participant of ``program`` (int64 array).

    ``None`` places rank ``i`` on node ``i`` and in-network participants on the nodes the
    program's ``switch_nodes`` parameter names (e.g. ``ina`` built for a topology); without
    it, it needs ``program.nranks <= topology.nranks`` and no in-network participant. An
    explicit ``placement`` has one node id per participant: ranks go on rank nodes,
    in-network participants on switch or NIC nodes; participants may share a node (transfers
    between them are then free). Raises ``SimulationError`` naming the participant or node
    that does not fit.
    """
    kinds = [p.kind for p in program.participants]
    nodes_of_switches = dict(program.params).get("switch_nodes")
    if placement is None and nodes_of_switches is not None:
        placement = [*range(program.nranks), *nodes_of_switches]
    if placement is None:
        if ParticipantKind.SWITCH in kinds:
            first = kinds.index(ParticipantKind.SWITCH)
            raise SimulationError(
                f"{program.name}: participant {first} is an in-network participant; pass "
                "placement= with a switch node for it"
            )
        if program.nranks > topology.nranks:
            raise SimulationError(
                f"{program.name} needs {program.nranks} ranks but topology {topology.name} has "
                f"{topology.nranks}; use a larger topology or pass placement="
            )
        return np.arange(program.nranks, dtype=np.int64)
    nodes = list(placement)
    if len(nodes) != len(kinds):
        raise SimulationError(
            f"placement has {len(nodes)} entries but {program.name} has {len(kinds)} "
            "participants; give one topology node per participant"
        )
    for part, (node, kind) in enumerate(zip(nodes, kinds, strict=True)):
        if isinstance(node, bool) or not isinstance(node, int | np.integer):
            raise SimulationError(f"placement of participant {part} is {node!r}, not a node id")
        if not 0 <= node < topology.nnodes:
            raise SimulationError(
                f"placement puts participant {part} on node {node}, but topology "
                f"{topology.name} has nodes 0..{topology.nnodes - 1}"
            )
        is_rank_node = topology.nodes[node].kind is NodeKind.RANK
        if (kind is ParticipantKind.RANK) != is_rank_node:
            what = "rank" if kind is ParticipantKind.RANK else "in-network participant"
            raise SimulationError(
                f"placement puts {what} {part} on {topology.nodes[node].kind.value} node {node} "
                f"({topology.nodes[node].name}); ranks go on rank nodes, in-network "
                "participants on switch or NIC nodes"
            )
    return np.asarray(nodes, dtype=np.int64)


class Connections:
    """The connections of a program's sends on a topology, as link incidence.

    Attributes (numpy arrays): ``of_step`` connection of each step (-1 unless it is a send);
    ``chunks`` sent over each connection in all;
    ``ptr``/``link``/``fraction`` CSR incidence per connection (links into
    ``topology.links``, fraction of each message on that link); ``latency`` per connection
    (seconds); ``solo_time_per_byte`` per connection, ``max fraction / bandwidth`` over its
    links (seconds/byte of a message with its links to itself); ``contended`` per connection,
    whether one of its links is crossed by the sends of more than one *stream* (participant
    channel) — the sends of one stream run one after another, so an uncontended connection's
    messages always have their links to themselves; ``bandwidth`` per link
    (bytes/s); ``senders``, ``receivers`` participants and ``nodes`` ``(src, dst)`` topology
    nodes per connection. Raises ``SimulationError`` when some connection has no route.
    """

    def __init__(self, program: Program, topology: Topology, nodes: np.ndarray) -> None:
        t = program.table
        nparts = len(program.participants)
        self.of_step = np.full(len(t), -1, dtype=np.int32)
        starts = t.channel_starts
        keys, self.chunks, lowest, highest = number_connections(
            t.peer, t.count, t.op, int(Op.SEND), starts, t.part[starts[:-1]], nparts, self.of_step
        )
        self.senders = keys // nparts
        self.receivers = keys % nparts
        self.nodes = np.stack((nodes[self.senders], nodes[self.receivers]), axis=1)
        self.bandwidth = np.array([lk.bandwidth for lk in topology.links], dtype=np.float64)
        prefetch_routes(topology, np.unique(self.nodes[:, 1]).tolist())
        cache: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
        lengths = np.zeros(len(keys) + 1, dtype=np.int64)
        links: list[int] = []
        fractions: list[float] = []
        for c, (u, v) in enumerate(self.nodes.tolist()):
            entry = cache.get((u, v))
            if entry is None:
                entry = cache[(u, v)] = self._route(program, topology, c, u, v)
            links += entry[0]
            fractions += entry[1]
            lengths[c + 1] = len(entry[0])
        self.ptr = np.cumsum(lengths)
        self.link = np.asarray(links, dtype=np.int64)
        self.fraction = np.asarray(fractions, dtype=np.float64)
        self.solo_time_per_byte = segment_max(self.fraction / self.bandwidth[self.link], self.ptr)
        link_latency = np.array([lk.latency for lk in topology.links], dtype=np.float64)
        owner = np.repeat(np.arange(len(keys)), lengths[1:])
        # Mean latency over a connection's routes: each link weighted by its fraction.
        self.latency = np.bincount(
            owner, weights=self.fraction * link_latency[self.link], minlength=len(keys)
        )
        self.contended = self._contended(lowest, highest)

    def _route(
        self, program: Program, topology: Topology, c: int, u: int, v: int
    ) -> tuple[list[int], list[float]]:
        """Links of connection ``c`` from node ``u`` to ``v`` and the fraction on each."""
        if u == v:
            return [], []
        try:
            paths = weighted_routes(topology, u, v)
        except TopologyError as err:
            raise SimulationError(
                f"{program.name}: participant {self.senders[c]} (node {u}) sends to participant "
                f"{self.receivers[c]} (node {v}) but {err}"
            ) from err
        uses: Counter[int] = Counter()
        for path, share in paths:
            for link in path:
                uses[link] += share
        ordered = sorted(uses)
        return ordered, [uses[link] for link in ordered]

    def _contended(self, lowest: np.ndarray, highest: np.ndarray) -> np.ndarray:
        """Per connection, whether one of its links is also crossed by sends of another stream
        (participant channel); given the lowest and highest stream sending on each."""
        nconns, big = len(self.latency), np.iinfo(np.int64).max
        owner = np.repeat(np.arange(nconns), np.diff(self.ptr))
        nlinks = len(self.bandwidth)
        link_lowest, link_highest = np.full(nlinks, big), np.full(nlinks, -1)
        np.minimum.at(link_lowest, self.link, lowest[owner])
        np.maximum.at(link_highest, self.link, highest[owner])
        mixed = link_lowest[self.link] != link_highest[self.link]
        return np.bincount(owner[mixed], minlength=nconns) > 0

    def latency_of(self, sends: np.ndarray) -> np.ndarray:
        """Latency (seconds) of the connection of each send step in ``sends``."""
        return self.latency[self.of_step[sends]]

    def expand(self, sends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Link incidence of the send steps ``sends``: ``(ptr, link, fraction)``, send ``i``
        owning entries ``ptr[i]:ptr[i+1]``."""
        ptr, entry = gather_segments(self.ptr, self.of_step[sends])
        return ptr, self.link[entry], self.fraction[entry]

    def contended_sends(self) -> np.ndarray:
        """The send steps on contended connections (sorted)."""
        if not self.contended.any():
            return np.zeros(0, dtype=np.int64)
        sends = np.flatnonzero(self.of_step >= 0)
        return sends[self.contended[self.of_step[sends]]]

    def link_bytes(self, chunk_bytes: float) -> np.ndarray:
        """Bytes carried by every link (aligned with ``topology.links``) over the program,
        with ``chunk_bytes`` bytes per chunk."""
        owner = np.repeat(np.arange(len(self.latency)), np.diff(self.ptr))
        return np.bincount(
            self.link,
            weights=self.fraction * self.chunks[owner] * chunk_bytes,
            minlength=len(self.bandwidth),
        )
