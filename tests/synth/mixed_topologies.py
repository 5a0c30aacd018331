"""Mixed-speed topologies for the routing tests: slow switches beside fast ones, oversubscribed
NICs, heterogeneous boxes, uneven rails; hand-made ones and seeded random ones (deterministic)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from commflow.topology import Node, NodeKind, Topology, make_topology
from commflow.topology.graph import duplex

GB = 1e9
LATENCY = 1e-6


def cluster(name: str, boxes: Sequence[int], *, box_bw: Sequence[float],
            nic_bw: Sequence[float] = (), per_nic: int = 1, rails: Sequence[float] = (),
            side_switch: float | None = None, side_in_box: bool = True,
            net_switch: float | None = None, ring: float | None = None) -> Topology:
    """Boxes of ``boxes[b]`` ranks on a box switch of ``box_bw[b]`` bytes/s per port; with
    several boxes, one NIC per ``per_nic`` ranks at ``nic_bw[b]`` per rail (``rails``: the
    rails' NIC-to-switch bandwidth factors, one IB switch each); ``side_switch``: a second,
    slower switch in every box (``side_in_box=False``: one outside all boxes); ``net_switch``:
    a slow network switch all ranks reach; ``ring``: direct links between neighbours of a box."""
    nodes: list[Node] = []
    ranks: list[list[int]] = []
    for b, count in enumerate(boxes):
        ranks.append(list(range(len(nodes), len(nodes) + count)))
        nodes += [Node(len(nodes) + i, NodeKind.RANK, f"b{b}r{i}", b) for i in range(count)]
    links = []

    def add(kind: NodeKind, label: str, box: int | None) -> int:
        nodes.append(Node(len(nodes), kind, label, box))
        return len(nodes) - 1

    outside = None if side_in_box or side_switch is None else add(NodeKind.SWITCH, "side", None)
    for b, members in enumerate(ranks):
        hub = add(NodeKind.SWITCH, f"b{b}sw", b)
        links += [lk for r in members for lk in duplex(r, hub, box_bw[b], LATENCY)]
        if side_switch is not None:
            side = add(NodeKind.SWITCH, f"b{b}side", b) if side_in_box else outside
            links += [lk for r in members for lk in duplex(r, side, side_switch, LATENCY)]
        if ring is not None and len(members) > 2:
            for i, r in enumerate(members):
                links += duplex(r, members[(i + 1) % len(members)], ring, LATENCY)
    if len(boxes) > 1:
        factors = rails or (1.0,)
        ib = [add(NodeKind.SWITCH, f"ib{k}", None) for k in range(len(factors))]
        for b, members in enumerate(ranks):
            for k, factor in enumerate(factors):
                for first in range(0, len(members), per_nic):
                    nic = add(NodeKind.NIC, f"b{b}nic{first}.{k}", b)
                    for r in members[first:first + per_nic]:
                        links += duplex(r, nic, nic_bw[b] * factor, LATENCY)
                    links += duplex(nic, ib[k], nic_bw[b] * factor, LATENCY)
    if net_switch is not None:
        net = add(NodeKind.SWITCH, "eth", None)
        links += [lk for members in ranks for r in members for lk in duplex(r, net, net_switch,
                                                                             LATENCY)]
    return make_topology(name, nodes, links)


def hand_made() -> list[Topology]:
    """Each situation of issue 16 once."""
    return [
        cluster("two-switches", [4], box_bw=[100 * GB], side_switch=10 * GB),
        cluster("switch-beside-network", [4], box_bw=[100 * GB], side_switch=10 * GB,
                side_in_box=False),
        cluster("slow-ring-fast-switch", [4], box_bw=[50 * GB], ring=5 * GB),
        cluster("ethernet-beside-ib", [3, 3], box_bw=[100 * GB] * 2, nic_bw=[25 * GB] * 2,
                net_switch=5 * GB),
        cluster("oversubscribed-nics", [4, 4], box_bw=[100 * GB] * 2, nic_bw=[25 * GB] * 2,
                per_nic=2),
        cluster("hetero-boxes", [4, 4], box_bw=[300 * GB, 50 * GB],
                nic_bw=[25 * GB, 12.5 * GB]),
        cluster("uneven-rails", [2, 2], box_bw=[100 * GB] * 2, nic_bw=[25 * GB] * 2,
                rails=(1.0, 0.4)),
        cluster("three-unlike-boxes", [2, 3, 3], box_bw=[100 * GB, 50 * GB, 200 * GB],
                nic_bw=[25 * GB, 25 * GB, 50 * GB]),
    ]


def generated(count: int, seed: int = 16) -> list[Topology]:
    """``count`` random mixed-speed clusters of 3-8 ranks (seeded, so always the same)."""
    rng = random.Random(seed)
    speeds = [5 * GB, 10 * GB, 25 * GB, 50 * GB, 100 * GB, 300 * GB]
    found: list[Topology] = []
    while len(found) < count:
        i = len(found)
        nboxes = rng.choice([1, 1, 2, 2, 3])
        boxes = [rng.randint(2, 4) for _ in range(nboxes)] if nboxes > 1 else [rng.randint(3, 6)]
        if sum(boxes) > 8:  # small enough for the tests to simulate quickly
            continue
        box_bw = [rng.choice(speeds[2:]) for _ in boxes]
        nic_bw = [rng.choice(speeds[:4]) for _ in boxes]
        side = rng.choice(speeds[:2]) if nboxes == 1 else rng.choice([None, *speeds[:2]])
        found.append(cluster(
            f"random-{i}", boxes, box_bw=box_bw, nic_bw=nic_bw,
            per_nic=rng.choice([1, 1, 2]), rails=rng.choice([(1.0,), (1.0, 1.0), (1.0, 0.5)]),
            side_switch=side, side_in_box=rng.random() < 0.5,
            net_switch=rng.choice([None, None, rng.choice(speeds[:2])]),
            ring=rng.choice([None, None, rng.choice(speeds[:2])])))
    return found
