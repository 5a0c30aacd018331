"""NCCL topology XML (the file ``NCCL_TOPO_FILE`` names, or ``NCCL_TOPO_DUMP_FILE`` writes).

``system > cpu > pci (> pci ...) > {gpu > nvlink, nic > net}``. Modelling:

- each ``gpu`` is a rank, numbered by its ``rank`` attribute, else in ``dev`` order; its bus id
  is the ``busid`` of its parent ``pci`` element;
- ``<nvlink target count tclass>`` gives ``count`` NVLinks of :data:`NVLINK_BANDWIDTH` (chosen
  by the GPU's ``sm``) to the GPU whose bus id is ``target`` (one duplex connection per GPU
  pair, which NCCL lists from both ends), or, with ``tclass="0x068000"``, to one NVSwitch node
  (all NVSwitch chips of the box merge into it);
- each ``net`` is a NIC node with a duplex link of ``speed`` Mb/s (x 1e6 / 8 bytes/s) to the
  GPUs under the nearest enclosing PCI switch or CPU that holds any, and to one network switch.

Latencies are the modelling defaults of :mod:`commflow.topology.systems`. Malformed XML,
missing attributes and dangling targets raise ``TopologyError`` naming the line and element.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NoReturn
from xml.parsers import expat

from commflow.errors import TopologyError
from commflow.topology.graph import Link, Node, NodeKind, Topology, duplex, make_topology
from commflow.topology.systems import INTRA_BOX_LATENCY, NETWORK_LATENCY

NVLINK_BANDWIDTH: dict[int, float] = {6: 20e9, 7: 25e9, 8: 25e9, 9: 25e9, 10: 50e9}
"""Bytes/s per NVLink per direction by GPU architecture (``sm // 10``): Pascal NVLink1 20 GB/s,
Volta NVLink2, Ampere NVLink3 and Hopper NVLink4 25 GB/s, Blackwell NVLink5 50 GB/s."""

NVSWITCH_TCLASS = "0x068000"
"""PCI class NCCL writes for an NVLink whose far end is an NVSwitch."""


@dataclass(eq=False)
class _Element:
    tag: str
    attrs: dict[str, str]
    line: int
    parent: _Element | None
    children: list[_Element] = field(default_factory=list)

    def iter(self, tag: str) -> Iterator[_Element]:
        """Descendants (self included) with ``tag``, in document order (no recursion, so any
        depth of nesting is fine)."""
        stack = [self]
        while stack:
            element = stack.pop()
            if element.tag == tag:
                yield element
            stack.extend(reversed(element.children))

    def ancestors(self) -> Iterator[_Element]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


class _Reader:
    """Parses the XML into :class:`_Element` trees and raises located errors."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        parser = expat.ParserCreate()
        stack: list[_Element] = []
        roots: list[_Element] = []

        def start(tag: str, attrs: dict[str, str]) -> None:
            parent = stack[-1] if stack else None
            element = _Element(tag, attrs, parser.CurrentLineNumber, parent)
            (parent.children if parent else roots).append(element)
            stack.append(element)

        parser.StartElementHandler = start
        parser.EndElementHandler = lambda tag: stack.pop()
        try:
            parser.Parse(text, True)
        except expat.ExpatError as e:
            raise TopologyError(
                f"{source}: line {e.lineno}: malformed XML: {expat.ErrorString(e.code)}"
            ) from None
        if roots[0].tag != "system":
            self.fail(roots[0], "the root element must be <system> (an NCCL topology file)")
        self.root = roots[0]

    def fail(self, element: _Element, message: str) -> NoReturn:
        raise TopologyError(f"{self.source}: line {element.line}: <{element.tag}>: {message}")

    def attr(self, element: _Element, name: str) -> str:
        value = element.attrs.get(name)
        if value is None:
            self.fail(element, f"missing attribute '{name}'")
        return value

    def number(self, element: _Element, name: str, kind: type = int) -> int | float:
        text = self.attr(element, name)
        try:
            return kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            self.fail(element, f"attribute {name}={text!r} is not {what}")


def _rank_order(reader: _Reader, gpus: list[_Element]) -> list[int]:
    """The rank of each ``gpu`` element (``rank`` attributes, else ``dev`` order)."""
    with_rank = [g for g in gpus if "rank" in g.attrs]
    if with_rank and len(with_rank) != len(gpus):
        reader.fail(next(g for g in gpus if "rank" not in g.attrs), "missing attribute 'rank'")
    if with_rank:
        ranks = [reader.number(g, "rank") for g in gpus]
    else:
        devs = [reader.number(g, "dev") for g in gpus]
        order = sorted(range(len(gpus)), key=devs.__getitem__)
        ranks = [0] * len(gpus)
        for rank, index in enumerate(order):
            ranks[index] = rank
    seen: set[int] = set()
    for gpu, rank in zip(gpus, ranks, strict=True):
        if not 0 <= rank < len(gpus) or rank in seen:
            reader.fail(gpu, f"rank {rank} is out of range or repeated; need 0..{len(gpus) - 1}")
        seen.add(rank)
    return ranks


def _busid(reader: _Reader, gpu: _Element) -> str:
    if gpu.parent is None or gpu.parent.tag != "pci":
        reader.fail(gpu, "a <gpu> must sit inside the <pci> element that gives its bus id")
    return reader.attr(gpu.parent, "busid").lower()


def parse(text: str, *, name: str = "nccl-topo", source: str = "<nccl-xml>") -> Topology:
    """Parse an NCCL topology XML document into a single-box :class:`Topology`.

    Raises ``TopologyError`` naming the line and element of malformed XML, a missing or bad
    attribute, an unknown ``sm``, or an ``nvlink`` target that is no GPU of the file.
    """
    reader = _Reader(text, source)
    gpus = list(reader.root.iter("gpu"))
    if not gpus:
        reader.fail(reader.root, "no <gpu> elements: nothing to make ranks of")
    ranks = _rank_order(reader, gpus)
    by_bus = {_busid(reader, g): r for g, r in zip(gpus, ranks, strict=True)}
    nodes = [Node(r, NodeKind.RANK, f"gpu{r}", 0) for r in range(len(gpus))]
    links: list[Link] = []

    def add_node(kind: NodeKind, node_name: str, box: int | None) -> int:
        nodes.append(Node(len(nodes), kind, node_name, box))
        return len(nodes) - 1

    nvswitch: int | None = None
    pairs: dict[tuple[int, int], tuple[int, float]] = {}
    for gpu, rank in zip(gpus, ranks, strict=True):
        for nvlink in gpu.iter("nvlink"):
            arch = reader.number(gpu, "sm") // 10
            if arch not in NVLINK_BANDWIDTH:
                reader.fail(gpu, f"unknown GPU architecture sm={gpu.attrs['sm']}")
            count = reader.number(nvlink, "count")
            target = reader.attr(nvlink, "target").lower()
            if count < 1:
                reader.fail(nvlink, f"count must be >= 1, got {count}")
            bandwidth = count * NVLINK_BANDWIDTH[arch]
            if nvlink.attrs.get("tclass", "").lower() == NVSWITCH_TCLASS:
                if nvswitch is None:
                    nvswitch = add_node(NodeKind.SWITCH, "nvswitch", 0)
                links += duplex(rank, nvswitch, bandwidth, INTRA_BOX_LATENCY, count)
            elif target in by_bus and by_bus[target] != rank:
                pair = (min(rank, by_bus[target]), max(rank, by_bus[target]))
                if pairs.setdefault(pair, (count, bandwidth)) != (count, bandwidth):
                    reader.fail(nvlink, f"GPUs {pair} list different NVLink counts or speeds")
            else:
                reader.fail(
                    nvlink,
                    f"target {target} is neither another GPU of this file nor an NVSwitch "
                    f"(tclass {NVSWITCH_TCLASS}); fix the target or remove the element",
                )
    for (a, b), (count, bandwidth) in sorted(pairs.items()):
        links += duplex(a, b, bandwidth, INTRA_BOX_LATENCY, count)

    gpu_ranks = dict(zip(map(id, gpus), ranks, strict=True))
    network: int | None = None
    scope_ranks: dict[int, list[int]] = {}  # id(element) -> ranks of the GPUs under it
    for i, net in enumerate(reader.root.iter("net")):
        bandwidth = reader.number(net, "speed", float) * 1e6 / 8
        if not bandwidth > 0:
            reader.fail(net, f"speed must be > 0 Mb/s, got {net.attrs['speed']}")
        nic = add_node(NodeKind.NIC, f"nic{i}.{reader.attr(net, 'name')}", 0)
        if network is None:
            network = add_node(NodeKind.SWITCH, "network", None)
        for scope in net.ancestors():
            local = scope_ranks.get(id(scope))
            if local is None:
                local = scope_ranks[id(scope)] = [gpu_ranks[id(g)] for g in scope.iter("gpu")]
            if local:
                break
        for rank in sorted(local):
            links += duplex(rank, nic, bandwidth, INTRA_BOX_LATENCY)
        links += duplex(nic, network, bandwidth, NETWORK_LATENCY)
    return make_topology(name, nodes, links)
