"""In-network aggregation (SwitchML, SHARP): switches add the ranks' data on its way up an
aggregation tree and send the sum back down, so each rank sends and receives its buffer
once.

An aggregation tree gives every rank and switch participant its parent (the root switch has
none). Ranks send each chunk to their parent switch; a switch receives its children's chunks
(adding them as they come), sends the sum up, and once the total comes down (or at the root)
sends it to each child. Several trees (e.g. one per core switch of a fat-tree) share the
data equally, chunk by chunk. Costs on a switch with links of bandwidth ``B`` per direction,
``n`` bytes: ``2α + n/B`` (``n/B`` up and down at once with ``chunks`` pipelining), against
the ring's ``2(p-1)/p · n/B``.

:func:`aggregation_trees` reads the trees off a topology: the roots are the switches
farthest from the ranks among those that reach every rank over switch-to-switch links (ties:
all of them, one tree each); every other switch hangs below
its breadth-first predecessor from the root over switch-to-switch links, every rank below
its nearest adjacent switch. Every switch is taken to aggregate (SHARP-like).
"""

from __future__ import annotations

from collections import deque

from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Program, ProgramBuilder, StepId, inp, out, scr
from commflow.topology.graph import NodeKind, Topology

Tree = tuple[int, ...]
"""``parent[p]`` of every participant (ranks, then switches): a switch participant id, -1
for the root, -2 for a switch not in the tree."""


def ina(collective: Collective, nranks: int, *, chunks: int = 1, channels: int = 1,
        root: int | None = None, trees: tuple[Tree, ...] | None = None,
        switch_nodes: tuple[int, ...] | None = None) -> Program:
    """Allreduce through aggregation ``trees`` (default: one switch every rank links to).

    ``switch_nodes`` records the topology node of each switch participant (what the
    simulator places them on; :func:`aggregation_trees` gives both). ``channels`` must be 1
    (trees split the data instead). Raises ``AlgorithmError`` for another collective, a
    malformed tree or ``channels > 1``.
    """
    if collective is not Collective.ALLREDUCE:
        raise AlgorithmError(f"ina aggregates allreduce only, not {collective.value}")
    if channels != 1:
        raise AlgorithmError("ina splits data over its trees; use channels=1 (or more trees)")
    if chunks < 1:
        raise AlgorithmError(f"ina needs chunks >= 1, got {chunks}")
    trees = trees or ((nranks,) * nranks + (-1,),)
    nswitches = len(trees[0]) - nranks
    _check_trees(trees, nranks, nswitches)
    if switch_nodes is not None and len(switch_nodes) != nswitches:
        raise AlgorithmError(f"ina: {len(switch_nodes)} switch nodes for {nswitches} switches")
    params: dict[str, object] = {"chunks": chunks, "trees": len(trees)}
    if switch_nodes is not None:
        params["switch_nodes"] = tuple(switch_nodes)
    ntrees = len(trees)
    b = ProgramBuilder(collective, nranks, chunk_factor=ntrees * chunks, name="ina",
                       params=params)
    for _ in range(nswitches):
        b.add_switch()
    total = nranks + nswitches
    partial: dict[tuple[int, int, int], StepId] = {}
    for t, parent in enumerate(trees):
        order = _bottom_up(parent, nranks)
        children: dict[int, list[int]] = {}
        for child, up in enumerate(parent):
            children.setdefault(up, []).append(child)
        for k in range(chunks):
            q = k * ntrees + t
            for p in order:
                _up(b, parent, children.get(p, []), p, q, 2 * t * total, nranks, partial, t)
            for p in reversed(order):
                _down(b, parent, children.get(p, []), p, q, (2 * t + 1) * total, nranks,
                      partial, t)
    return b.build()


def _check_trees(trees: tuple[Tree, ...], nranks: int, nswitches: int) -> None:
    for parent in trees:
        if len(parent) != nranks + nswitches:
            raise AlgorithmError("ina: every tree needs a parent entry per participant")
        roots = [p for p in range(nranks, len(parent)) if parent[p] == -1]
        if len(roots) != 1 or any(not nranks <= parent[r] < len(parent) for r in
                                  range(nranks)):
            raise AlgorithmError("ina: a tree needs one root switch and a switch above every rank")
        for p in range(len(parent)):
            seen, q = 0, p
            while parent[q] >= 0:
                q, seen = parent[q], seen + 1
                if seen > len(parent) or q < nranks:
                    raise AlgorithmError(f"ina: participant {p} does not reach the root switch")


def _bottom_up(parent: Tree, nranks: int) -> list[int]:
    """Participants of the tree, every child before its parent."""
    depth = {}
    for p in range(len(parent)):
        if parent[p] == -2:
            continue
        d, q = 0, p
        while parent[q] >= 0:
            q, d = parent[q], d + 1
        depth[p] = d
    return sorted(depth, key=lambda p: (-depth[p], p))


def _up(b: ProgramBuilder, parent: Tree, children: list[int], p: int, q: int, base: int,
        nranks: int,
        partial: dict[tuple[int, int, int], StepId], t: int) -> None:
    """Chunk ``q`` on its way up at participant ``p``: a rank sends its input; a switch adds
    its children's contributions and sends the sum up (the root keeps it). Each edge has
    an up channel (``base`` + the child's id) and a down channel, so chunks flow both ways
    at once."""
    if p < nranks:
        b.send(p, parent[p], inp(q), channel=base + p)
        return
    last: StepId | None = None
    for i, child in enumerate(children):
        deps = [] if last is None else [last]
        last = (b.recv(p, child, scr(q), channel=base + child) if i == 0 else
                b.recv_reduce(p, child, scr(q), scr(q), channel=base + child, deps=deps))
    assert last is not None
    partial[(t, p, q)] = last
    if parent[p] >= 0:
        b.send(p, parent[p], scr(q), channel=base + p, deps=[last])


def _down(b: ProgramBuilder, parent: Tree, children: list[int], p: int, q: int, base: int,
          nranks: int,
          partial: dict[tuple[int, int, int], StepId], t: int) -> None:
    """Chunk ``q`` on its way down at participant ``p``: a rank receives the sum into its
    output; a switch receives it (the root has it) and sends it to every child."""
    if p < nranks:
        b.recv(p, parent[p], out(q), channel=base + p)
        return
    ready = partial[(t, p, q)]
    if parent[p] >= 0:
        ready = b.recv(p, parent[p], scr(q), channel=base + p)
    for child in children:
        b.send(p, child, scr(q), channel=base + child, deps=[ready])


def aggregation_trees(topology: Topology) -> tuple[tuple[Tree, ...], tuple[int, ...]]:
    """The aggregation trees of ``topology`` (module docstring) and the topology node of each
    switch participant.

    Raises ``AlgorithmError`` when a rank has no adjacent switch.
    """
    n = topology.nranks
    switches = [node.id for node in topology.nodes if node.kind is NodeKind.SWITCH]
    adjacent: dict[int, set[int]] = {v: set() for v in range(topology.nnodes)}
    for link in topology.links:
        adjacent[link.src].add(link.dst)
    uplinks = {r: sorted(s for s in adjacent[r] if s in adjacent and
                         topology.nodes[s].kind is NodeKind.SWITCH) for r in range(n)}
    lonely = [r for r, ups in uplinks.items() if not ups]
    if lonely:
        raise AlgorithmError(
            f"ina on {topology.name}: rank {lonely[0]} links to no switch; in-network "
            "aggregation needs every rank on a switch (e.g. switch8, fat-tree4)")
    switch_set = set(switches)
    hops = {s: _distances(s, adjacent, switch_set) for s in switches}
    spanning = [s for s in switches
                if all(any(u in hops[s] for u in uplinks[r]) for r in range(n))]
    if not spanning:
        raise AlgorithmError(
            f"ina on {topology.name}: no switch reaches every rank over switch links; "
            "in-network aggregation needs a switch tree spanning the ranks")
    height = {s: min(hops[s][u] for r in range(n) for u in uplinks[r] if u in hops[s])
              for s in spanning}
    top = max(height.values())
    roots = [s for s in spanning if height[s] == top]
    used: list[int] = []
    trees_nodes = []
    for root in roots:
        dist = hops[root]
        above = {r: min(uplinks[r], key=lambda s: (dist.get(s, 10**9), s)) for r in range(n)}
        pred = _predecessors(root, adjacent, switch_set)
        members = set()
        for s in above.values():
            while s != root:
                members.add(s)
                s = pred[s]
        members.add(root)
        for s in sorted(members):
            if s not in used:
                used.append(s)
        trees_nodes.append((above, pred, members, root))
    index = {s: n + i for i, s in enumerate(used)}
    trees = []
    for above, pred, members, root in trees_nodes:
        parent = [index[above[r]] for r in range(n)] + [-2] * len(used)
        for s in members:
            parent[index[s]] = -1 if s == root else index[pred[s]]
        trees.append(tuple(parent))
    return tuple(trees), tuple(used)


def _distances(start: int, adjacent: dict[int, set[int]], allowed: set[int]) -> dict[int, int]:
    """Hops from ``start`` to every switch reachable over switch-to-switch links."""
    dist, queue = {start: 0}, deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(adjacent[v]):
            if w in allowed and w not in dist:
                dist[w] = dist[v] + 1
                queue.append(w)
    return dist


def _predecessors(root: int, adjacent: dict[int, set[int]], allowed: set[int]) -> dict[int, int]:
    """Breadth-first predecessor of every switch reachable from ``root``."""
    pred, queue = {root: root}, deque([root])
    while queue:
        v = queue.popleft()
        for w in sorted(adjacent[v]):
            if w in allowed and w not in pred:
                pred[w] = v
                queue.append(w)
    return pred


register((Collective.ALLREDUCE,), "ina", ina,
         "in-network aggregation up switch trees (SwitchML/SHARP): 2α + n/B",
         ("trees", "switch_nodes"), in_network=True)
