"""Presets of real machines, modelled as in ``shared/REFERENCES.md`` ("Topologies").

Ranks are numbered box by box (``rank = box * gpus_per_box + local``) and named
``box<b>.gpu<i>``. A single box is modelled without its network; NICs and IB switches appear
only with several boxes. An NVSwitch is one switch node per box with one port link per GPU
(never a full mesh, which would overstate bandwidth).

Every preset takes keyword-only overrides: ``bandwidth`` sets the per-link intra-box figure
(one NVLink, one xGMI link, or one NVSwitch port), bytes/s; ``network_bandwidth`` the
inter-box links, bytes/s; ``latency`` sets every link's latency, seconds. Latency defaults are
modelling choices, not measurements: :data:`INTRA_BOX_LATENCY` for links inside a box
(NVLink, xGMI, NVSwitch ports, GPU to NIC) and :data:`NETWORK_LATENCY` for links that leave it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from commflow.errors import TopologyError
from commflow.topology.graph import Link, Node, NodeKind, Topology, duplex, make_topology

INTRA_BOX_LATENCY = 1e-6
"""Default latency of a link inside a box, seconds (modelling choice)."""

NETWORK_LATENCY = 5e-6
"""Default latency of a link between boxes (IB cable, switch port), seconds (modelling choice)."""

NVLINK2_BANDWIDTH = 25e9
"""One V100 NVLink, bytes/s per direction."""

IB_EDR_BANDWIDTH = 12.5e9
"""One 100 Gb/s InfiniBand link (NDv2, DGX-2), bytes/s per direction."""

DGX1_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 2, (0, 4): 2, (1, 3): 2, (2, 3): 2, (2, 6): 2, (4, 5): 2, (5, 7): 2, (6, 7): 2,
    (0, 2): 1, (0, 3): 1, (1, 2): 1, (1, 5): 1, (3, 7): 1, (4, 6): 1, (4, 7): 1, (5, 6): 1,
}  # fmt: skip
"""NVLink count between the GPUs of a DGX-1 / NDv2 box (each GPU has 6)."""

MI250_XGMI: dict[int, dict[int, int]] = {
    0: {1: 4, 4: 2, 8: 1}, 1: {0: 4, 5: 1, 9: 1, 10: 1}, 2: {3: 4, 6: 1, 9: 1, 10: 1},
    3: {2: 4, 7: 2, 11: 1}, 4: {5: 4, 0: 2, 6: 1}, 5: {4: 4, 1: 1, 6: 1, 7: 1},
    6: {7: 4, 2: 1, 4: 1, 5: 1}, 7: {6: 4, 3: 2, 5: 1}, 8: {9: 4, 12: 2, 0: 1},
    9: {8: 4, 1: 1, 2: 1, 13: 1}, 10: {11: 4, 1: 1, 2: 1, 14: 1}, 11: {10: 4, 15: 2, 3: 1},
    12: {13: 4, 8: 2, 14: 1}, 13: {12: 4, 9: 1, 14: 1, 15: 1},
    14: {15: 4, 10: 1, 12: 1, 13: 1}, 15: {14: 4, 11: 2, 13: 1},
}  # fmt: skip
"""xGMI link count from each GCD of an MI250 box to its peers (symmetric; 7 links per GCD)."""


@dataclass
class _Builder:
    """Accumulates the nodes and links of a multi-box preset."""

    name: str
    boxes: int
    gpus_per_box: int
    intra_latency: float
    network_latency: float
    nodes: list[Node] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.boxes, bool) or not isinstance(self.boxes, int) or self.boxes < 1:
            raise TopologyError(f"{self.name}: boxes must be an integer >= 1, got {self.boxes!r}")
        for box in range(self.boxes):
            for local in range(self.gpus_per_box):
                self.add(NodeKind.RANK, f"box{box}.gpu{local}", box)

    def rank(self, box: int, local: int) -> int:
        return box * self.gpus_per_box + local

    def add(self, kind: NodeKind, name: str, box: int | None) -> int:
        self.nodes.append(Node(len(self.nodes), kind, name, box))
        return len(self.nodes) - 1

    def nvswitch(self, bandwidth: float) -> None:
        """One NVSwitch per box, a duplex port link of ``bandwidth`` to each of its GPUs."""
        for box in range(self.boxes):
            sw = self.add(NodeKind.SWITCH, f"box{box}.nvswitch", box)
            for local in range(self.gpus_per_box):
                self.links += duplex(self.rank(box, local), sw, bandwidth, self.intra_latency)

    def build(self) -> Topology:
        suffix = f"x{self.boxes}" if self.boxes > 1 else ""
        return make_topology(self.name + suffix, self.nodes, self.links)


def _latencies(latency: float | None) -> tuple[float, float]:
    if latency is None:
        return INTRA_BOX_LATENCY, NETWORK_LATENCY
    return latency, latency


def _rail_optimized(
    name: str,
    boxes: int,
    port_bandwidth: float,
    network_bandwidth: float,
    latency: float | None,
) -> Topology:
    """8 GPUs per box on an NVSwitch; with several boxes one NIC per GPU and two rail IB
    switches (rail 0: the NICs of even GPUs, rail 1: odd GPUs)."""
    b = _Builder(name, boxes, 8, *_latencies(latency))
    b.nvswitch(port_bandwidth)
    if boxes > 1:
        rails = [b.add(NodeKind.SWITCH, f"ib-rail{r}", None) for r in range(2)]
        for box in range(boxes):
            for local in range(8):
                nic = b.add(NodeKind.NIC, f"box{box}.nic{local}", box)
                b.links += duplex(b.rank(box, local), nic, network_bandwidth, b.intra_latency)
                b.links += duplex(nic, rails[local % 2], network_bandwidth, b.network_latency)
    return b.build()


def ndv2(
    boxes: int = 1,
    *,
    bandwidth: float = NVLINK2_BANDWIDTH,
    network_bandwidth: float = IB_EDR_BANDWIDTH,
    latency: float | None = None,
) -> Topology:
    """Azure NDv2 (8x V100 per box, DGX-1 NVLink hybrid cube-mesh, 25 GB/s per NVLink).

    One 12.5 GB/s InfiniBand link per box: GPU 0 of each box sends, GPU 1 receives. With two
    boxes the links run directly (box0 GPU0 -> box1 GPU1, box1 GPU0 -> box0 GPU1); with more,
    every box's GPU 0 sends to one IB switch, which sends to every box's GPU 1.
    """
    b = _Builder("ndv2", boxes, 8, *_latencies(latency))
    for box in range(boxes):
        for (x, y), count in DGX1_NVLINKS.items():
            b.links += duplex(
                b.rank(box, x), b.rank(box, y), count * bandwidth, b.intra_latency, count
            )
    if boxes == 2:
        for box in range(2):
            b.links.append(
                Link(b.rank(box, 0), b.rank(1 - box, 1), network_bandwidth, b.network_latency)
            )
    elif boxes > 2:
        ib = b.add(NodeKind.SWITCH, "ib", None)
        for box in range(boxes):
            b.links.append(Link(b.rank(box, 0), ib, network_bandwidth, b.network_latency))
            b.links.append(Link(ib, b.rank(box, 1), network_bandwidth, b.network_latency))
    return b.build()


def dgx1(*, bandwidth: float = NVLINK2_BANDWIDTH, latency: float | None = None) -> Topology:
    """NVIDIA DGX-1 (8x V100): one :func:`ndv2` box, named ``dgx1``; diameter 2."""
    return replace(ndv2(1, bandwidth=bandwidth, latency=latency), name="dgx1")


def dgx2(
    boxes: int = 1,
    *,
    bandwidth: float = 125e9,
    network_bandwidth: float = IB_EDR_BANDWIDTH,
    latency: float | None = None,
) -> Topology:
    """NVIDIA DGX-2 (16x V100 per box), each GPU <-> NVSwitch at 125 GB/s per direction.

    With several boxes, 8 IB links per box at 12.5 GB/s: GPU ``2k+1`` of box ``b`` sends to
    GPU ``2k`` of box ``(b+1) mod boxes`` (directed links, no NIC nodes).
    """
    b = _Builder("dgx2", boxes, 16, *_latencies(latency))
    b.nvswitch(bandwidth)
    if boxes > 1:
        for box in range(boxes):
            for k in range(8):
                src, dst = b.rank(box, 2 * k + 1), b.rank((box + 1) % boxes, 2 * k)
                b.links.append(Link(src, dst, network_bandwidth, b.network_latency))
    return b.build()


def dgx_a100(
    boxes: int = 1,
    *,
    bandwidth: float = 300e9,
    network_bandwidth: float = 25e9,
    latency: float | None = None,
) -> Topology:
    """NVIDIA DGX A100 (8x A100 per box), each GPU <-> NVSwitch at 300 GB/s (12 NVLink3).

    With several boxes each GPU has its own 25 GB/s NIC (GPU <-> NIC <-> IB switch, 25 GB/s
    each way); the NICs of even GPUs meet in IB switch ``ib-rail0``, odd GPUs in ``ib-rail1``.
    """
    return _rail_optimized("dgx-a100", boxes, bandwidth, network_bandwidth, latency)


def dgx_h100(
    boxes: int = 1,
    *,
    bandwidth: float = 450e9,
    network_bandwidth: float = 50e9,
    latency: float | None = None,
) -> Topology:
    """NVIDIA DGX H100 (8x H100 per box), each GPU <-> NVSwitch at 450 GB/s; with several
    boxes one 50 GB/s NIC per GPU and two rail IB switches as in :func:`dgx_a100`."""
    return _rail_optimized("dgx-h100", boxes, bandwidth, network_bandwidth, latency)


RAIL_SYSTEMS: dict[str, tuple[str, float, float]] = {
    "dgx-a100": ("a100-80gb", 300e9, 25e9),
    "dgx-h100": ("h100-sxm", 450e9, 50e9),
}
"""Rail-optimized boxes :func:`mixed` combines: the accelerator their GPUs are (as
:mod:`commflow.plan.hardware` names it), NVSwitch port and NIC bytes/s per direction."""


def mixed(parts: Sequence[tuple[str, int]], *, latency: float | None = None) -> Topology:
    """A heterogeneous cluster: ``parts`` are ``(system, boxes)`` of :data:`RAIL_SYSTEMS`,
    e.g. ``[("dgx-a100", 2), ("dgx-h100", 1)]``, boxes numbered in that order. Each box keeps
    its NVSwitch port and NIC bandwidth and labels its ranks with its accelerator
    (``Node.accelerator``); every NIC meets the two rail IB switches as in :func:`dgx_a100`,
    its link at its own box's NIC speed, so traffic between boxes of different kinds runs at
    the slower NIC. Named ``dgx-a100x2+dgx-h100x1``."""
    if not parts:
        raise TopologyError("mixed: give at least one (system, boxes) part")
    for system, count in parts:
        if system not in RAIL_SYSTEMS:
            raise TopologyError(
                f"mixed: unknown system {system!r}; use one of {', '.join(RAIL_SYSTEMS)}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise TopologyError(f"mixed: {system} needs boxes >= 1, got {count!r}")
    kinds = [system for system, count in parts for _ in range(count)]
    name = "+".join(f"{system}x{count}" for system, count in parts)
    b = _Builder(name, len(kinds), 8, *_latencies(latency))
    b.nodes = [replace(n, accelerator=RAIL_SYSTEMS[kinds[n.box or 0]][0]) for n in b.nodes]
    for box, system in enumerate(kinds):
        sw = b.add(NodeKind.SWITCH, f"box{box}.nvswitch", box)
        for local in range(8):
            b.links += duplex(b.rank(box, local), sw, RAIL_SYSTEMS[system][1], b.intra_latency)
    if len(kinds) > 1:
        rails = [b.add(NodeKind.SWITCH, f"ib-rail{r}", None) for r in range(2)]
        for box, system in enumerate(kinds):
            nic_bandwidth = RAIL_SYSTEMS[system][2]
            for local in range(8):
                nic = b.add(NodeKind.NIC, f"box{box}.nic{local}", box)
                b.links += duplex(b.rank(box, local), nic, nic_bandwidth, b.intra_latency)
                b.links += duplex(nic, rails[local % 2], nic_bandwidth, b.network_latency)
    return make_topology(name, b.nodes, b.links)


def mi250(
    boxes: int = 1,
    *,
    bandwidth: float = 50e9,
    network_bandwidth: float = 16e9,
    latency: float | None = None,
) -> Topology:
    """AMD MI250 box (16 GCDs) with the xGMI links of :data:`MI250_XGMI`, 50 GB/s each.

    With several boxes each GCD also has a 16 GB/s duplex link to one IB switch shared by all
    boxes.
    """
    b = _Builder("mi250", boxes, 16, *_latencies(latency))
    for box in range(boxes):
        for x, peers in MI250_XGMI.items():
            for y, count in peers.items():
                if x < y:
                    b.links += duplex(
                        b.rank(box, x), b.rank(box, y), count * bandwidth, b.intra_latency, count
                    )
    if boxes > 1:
        ib = b.add(NodeKind.SWITCH, "ib", None)
        for rank in range(boxes * 16):
            b.links += duplex(rank, ib, network_bandwidth, b.network_latency)
    return b.build()
