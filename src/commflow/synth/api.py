"""The front door: :func:`synthesize` picks the synthesis method for a collective."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from commflow.collectives import Collective, check_root, parse_collective
from commflow.errors import AlgorithmError
from commflow.ir import Program
from commflow.synth.alltoall_lp import alltoall_flow, alltoall_program
from commflow.synth.bound_check import check_trees
from commflow.synth.boxes import by_box, dedicated_edges
from commflow.synth.forest import Forest, at_bound, cut_bound, forest, mirror
from commflow.synth.links import LogicalEdges, logical_edges
from commflow.synth.lower import DOWN, depth, lower, steps_per_piece
from commflow.synth.merge import Merge, merge_name
from commflow.synth.remember import recall, topology_key
from commflow.synth.steps import pareto, schedule_program
from commflow.synth.streams import lower_streams
from commflow.synth.trees import WeightedTree, balanced_shares, integral_shares, pack_trees
from commflow.topology.graph import Topology
from commflow.topology.routing import diameter

_UNITS = range(1, 25)
"""Share counts per root :func:`~commflow.synth.trees.integral_shares` tries, fewest first."""

ALLTOALL_CHUNKS = 24
"""Chunks per block for alltoall programs (DGX-1: within 1.1% of the cut bound at 1 GiB)."""

OBJECTIVES = ("bandwidth", "latency")
"""What :func:`synthesize` optimises: large-message time or step count. The fastest program
at one size is chosen among these and the predefined ones by :func:`commflow.tune.choose`."""

PIECES_PER_LEVEL = 64
"""Pipelined chunks per share and tree level when ``pieces`` is not given. A share's last chunk
trails its first by the tree depth, so the time lost is about ``depth / pieces``: 64 per level
keeps it within ~1.7% at 1 GiB (DGX H100 x2 reduce-scatter, 4 levels: 98.3% of the bound
with 256 pieces in the flow model)."""

MAX_STEPS = 2_000_000
"""Most steps a tree program on up to 16 ranks gets from the default ``pieces`` (fewer pieces
beyond it; see :func:`step_budget` for more ranks)."""

MOST_STEPS = 16_000_000
"""Most steps a tree program on any number of ranks gets from the default ``pieces``
(~0.6 GB of program, ~10 s of lowering)."""

STREAM_PIECES = 1024
"""Chunks per root's data a program with one stream per edge gets by default on up to 16
ranks (half as many for allreduce, which moves each twice; ``nranks`` times as many for
broadcast and reduce, whose one root carries them all), times ``(nranks / 16)**2`` beyond
(as :func:`step_budget`), within the step budget. MI250 (3 trees per root):
99.5-99.6% of the bound at 1 GiB in the flow model, synthesized in under 1 s; MI250 x2 gains
from the 4,032 it gets (reduce-scatter 98.1% with 1,024, 98.6%)."""

BALANCED_PIECES = 256
"""Most chunks per root's data that a fractional packing lowered with one stream per edge
gets dealt by :func:`~commflow.synth.trees.balanced_shares` (the busiest link 1.0-1.6% above
the optimum at 48-64 on MI250 x2, 2.3-2.5% rounded root by root); more are dealt root by
root, within ~1/pieces of the weights."""

MIN_PIECES = 128
"""Pieces per share the number of trees per root must leave room for within
:data:`MAX_STEPS` (pipelining needs them; a few more trees gain little)."""


def step_budget(nranks: int) -> int:
    """Most steps a tree program on ``nranks`` ranks gets from the default ``pieces``:
    :data:`MAX_STEPS`, times ``(nranks / 16)**2`` beyond 16 ranks (a piece's steps grow with
    roots x tree edges, so this leaves as many pieces as on 16 ranks), at most
    :data:`MOST_STEPS`."""
    return min(MOST_STEPS, MAX_STEPS * max(nranks, 16) ** 2 // 256)


def synthesize(
    collective: Collective | str,
    topology: Topology,
    *,
    objective: str = "bandwidth",
    root: int = 0,
    pieces: int | None = None,
    time_limit: float | None = None,
    levels: int = 0,
    trees: int | None = None,
    merge: Merge | None = None,
) -> Program:
    """A program for ``collective`` on ``topology``, synthesized for ``objective``.

    ``bandwidth``: spanning-tree packing (allgather, reducescatter, allreduce as RS + AG,
    broadcast, reduce; :mod:`commflow.synth.trees`), lowered with each root's data in equal
    shares of ``pieces`` chunks (default: :data:`PIECES_PER_LEVEL` per tree level), or, where
    the edges with links of their own reach the bound, with one stream per edge
    (:mod:`commflow.synth.streams`; ``pieces`` chunks per tree of an exact packing, else per
    root's data; default :data:`STREAM_PIECES` per root's data); alltoall by a
    multi-commodity flow LP (:mod:`commflow.synth.alltoall_lp`), ``pieces`` chunks per block
    (default :data:`ALLTOALL_CHUNKS`). ``latency`` (allgather): the SCCL step schedule with the
    fewest steps (:mod:`commflow.synth.steps`), each MILP given ``time_limit`` seconds
    (default 30). ``root`` is used by broadcast and reduce. ``levels`` > 0 gives a program
    with one stream per edge up to that many channels per edge, by tree depth (for
    MSCCL-family runtimes, which run a program in loops; other lowerings ignore it), and
    ``merge`` = ``(head, group)`` one whose chunks of each tree travel ``group`` at a time
    but in messages of the ``head`` sizes at either end (an int: that many single chunks;
    :func:`~commflow.synth.merge.merged`; fewer steps). ``trees`` caps the trees per root
    of a packing lowered in shares (default: as many as leave :data:`MIN_PIECES` pieces per
    share within :data:`MAX_STEPS`, at most 24): fewer trees, fewer steps per piece (MSCCL's
    caps; DGX A100 x2 has an exact packing with one tree per root). Raises
    ``AlgorithmError`` for an unknown objective, a collective no method covers or ``trees``
    < 1, and ``TopologyError`` when the ranks are not connected. Within
    :func:`~commflow.synth.remember.remembered`, the same call returns the same program.
    """
    kind = parse_collective(collective)
    key = (kind, objective, root, pieces, time_limit, levels, trees, merge,
           topology_key(topology))
    return recall(key, lambda: _synthesize(kind, topology, objective, root, pieces, time_limit,
                                           levels, trees, merge))


def _synthesize(kind: Collective, topology: Topology, objective: str, root: int,
                pieces: int | None, time_limit: float | None, levels: int, trees: int | None,
                merge: Merge | None) -> Program:
    """:func:`synthesize`, made afresh."""
    if objective not in OBJECTIVES:
        raise AlgorithmError(
            f"unknown objective {objective!r}; use one of {', '.join(OBJECTIVES)} (the fastest "
            "program at one size: commflow.tune.choose)")
    if objective == "latency":
        return _fewest_steps(kind, topology, time_limit)
    root = check_root(kind, topology.nranks, root)
    if kind is Collective.ALLTOALL:
        flow = alltoall_flow(logical_edges(topology))
        chunks = pieces or ALLTOALL_CHUNKS
        return alltoall_program(flow, topology.nranks, chunks=chunks, name="alltoall/synth_lp")
    if trees is not None and trees < 1:
        raise AlgorithmError(f"trees must be >= 1, got {trees}")
    return _tree_program(kind, topology, root, pieces, levels, trees, merge)


def _fewest_steps(kind: Collective, topology: Topology, time_limit: float | None) -> Program:
    """The allgather step schedule with the fewest steps and, among those, the least
    rounds per chunk (:func:`commflow.synth.steps.pareto`)."""
    if kind is not Collective.ALLGATHER:
        raise AlgorithmError(f"objective 'latency' covers allgather only, not {kind.value}")
    steps = diameter(topology)
    best = pareto(kind, topology, max_steps=steps, time_limit=time_limit or 30.0)[0]
    return schedule_program(best, topology.nranks, name="allgather/synth_steps")


def _shares(
    edges: LogicalEdges,
    roots: list[int] | None,
    units: Sequence[int],
    most_trees: int,
    mirrored: Forest | None = None,
) -> tuple[tuple[WeightedTree, ...], int, Forest | None]:
    """Trees in whole shares of each root's data, the shares per root, and the exact
    integer packing when it gave them: ``mirrored`` turned round if that is as good
    (:func:`~commflow.synth.forest.mirror`), else for all roots the composition of one box's
    packing (:func:`~commflow.synth.boxes.by_box`: shallower trees), else
    :func:`~commflow.synth.forest.forest` with up to ``most_trees`` trees per root, else the
    column-generation packing rounded to one of ``units`` shares."""
    exact = None if mirrored is None else mirror(mirrored, edges, roots)
    if exact is None and roots is None:
        exact = by_box(edges, most_trees)
    exact = exact or forest(edges, roots, most_trees=most_trees)
    if exact is not None:
        return exact.trees, exact.k, exact
    return *integral_shares(edges, pack_trees(edges, roots), units=units), None


def _most_trees(kind: Collective, nranks: int) -> int:
    """Trees per root that leave every share :data:`MIN_PIECES` pieces within
    :data:`MAX_STEPS` (at least 4, at most the largest of the share counts tried). Larger
    clusters' larger budgets (:func:`step_budget`) buy pieces, not trees: the tree search slows
    with many trees (MI250 x2: 23 trees per root take 50 s) for little gain."""
    fit = MAX_STEPS // (MIN_PIECES * steps_per_piece(kind, nranks, 1))
    return min(max(4, fit), _UNITS[-1])


def _tree_program(
    kind: Collective, topology: Topology, root: int | None, pieces: int | None, levels: int = 0,
    trees: int | None = None, merge: Merge | None = None,
) -> Program:
    """Tree packing lowered with ``pieces`` chunks per share; by default
    :data:`PIECES_PER_LEVEL` per level of the deepest share, within :func:`step_budget`;
    ``trees`` (or :func:`_most_trees`) trees and shares per root at most."""
    if kind in (Collective.GATHER, Collective.SCATTER):
        raise AlgorithmError(f"tree packing does not synthesize {kind.value}")
    edges = logical_edges(topology)
    roots = None if root is None else [root]
    streamed = _stream_program(kind, topology, edges, root, pieces, levels, merge)
    if streamed is not None:
        return streamed
    down = up = ()
    units = 1
    most_trees = trees or _most_trees(kind, topology.nranks)
    tried = _UNITS if trees is None else range(1, trees + 1)
    exact = None
    methods = set()
    if kind in (Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLREDUCE):
        down, units, exact = _shares(edges, roots, tried, most_trees)
        methods.add(exact is not None)
    if kind.reduces:
        reverse = edges.reversed()
        tries = [units, *tried] if down else tried
        up, up_units, up_exact = _shares(reverse, roots, tries, most_trees, mirrored=exact)
        methods.add(up_exact is not None)
        if down and up_units != units:  # allreduce: both halves cut into the same shares
            if math.lcm(units, up_units) <= _UNITS[-1]:
                up_units = math.lcm(units, up_units)
            else:
                down, _ = integral_shares(edges, pack_trees(edges, roots), units=[up_units])
                methods.add(False)
        units = up_units
    what = f"{kind.value} on {topology.name}"
    if down:
        check_trees(what, edges, down, roots)
    if up:
        check_trees(what, edges.reversed(), up, roots)
    if pieces is None:
        most = step_budget(topology.nranks) // steps_per_piece(kind, topology.nranks, units)
        pieces = max(1, min(PIECES_PER_LEVEL * (depth(down) + depth(up)), most))
    return lower(
        kind,
        topology.nranks,
        down=down,
        up=up,
        units=units,
        pieces=pieces,
        name=f"{kind.value}/synth_trees",
        root=root,
        params={
            "topology": topology.name,
            "units": units,
            "pieces": pieces,
            "packing": "forest" if methods == {True} else "columns",
        },
    )


def _stream_program(
    kind: Collective, topology: Topology, edges: LogicalEdges, root: int | None,
    pieces: int | None, levels: int = 0, merge: Merge | None = None,
) -> Program | None:
    """Trees at the cut bound over the edges with links of their own, lowered with one stream
    per edge (:mod:`commflow.synth.streams`): ``pieces`` chunks per tree of an exact packing
    of equal trees, else per root's data; by default :data:`STREAM_PIECES` chunks per root's
    data within :func:`step_budget`; ``levels`` channels per edge at most, by tree depth, and
    ``merge`` as :func:`~commflow.synth.streams.lower_streams` takes them. ``None`` when those
    edges fall short of the bound."""
    roots = None if root is None else [root]
    found = _streamed(kind, edges, roots)
    if found is None:
        return None
    own, down, up, units, method = found
    n = topology.nranks
    if pieces is None:
        budget = step_budget(n)
        halves = 2 if kind is Collective.ALLREDUCE else 1
        shares = n if kind.rooted else 1  # one root's data in as many chunks as all ranks'
        most = STREAM_PIECES * shares * budget // MAX_STEPS // halves
        pieces = max(1, min(budget // steps_per_piece(kind, n, 1), most) // units)
    if method == "columns" and units * pieces <= BALANCED_PIECES:
        down = down and balanced_shares(own, down, units * pieces)
        up = up and balanced_shares(own.reversed(), up, units * pieces)
    trees = max(sum(t.root == r for t in down or up) for r in range(n))
    extra = {"levels": levels} if levels else {}
    if merge is not None:
        extra["merge"] = merge_name(merge)
    return lower_streams(
        kind,
        own,
        down=down,
        up=up,
        pieces=units * pieces,
        name=f"{kind.value}/synth_trees",
        root=root,
        params={
            "topology": topology.name,
            "units": units,
            "pieces": pieces,
            "trees": trees,
            "packing": method,
            "lowering": "streams",
            **extra,
        },
        levels=levels,
        merge=merge,
    )


def _streamed(
    kind: Collective, edges: LogicalEdges, roots: list[int] | None
) -> tuple[LogicalEdges, tuple[WeightedTree, ...], tuple[WeightedTree, ...], int, str] | None:
    """``(edges, down-trees, up-trees, units, method)`` at the cut bound over the edges with
    links of their own (:func:`~commflow.synth.boxes.dedicated_edges`): when those are all
    the edges, ``k`` equal trees per root from :func:`~commflow.synth.forest.forest` (``units``:
    the least common multiple of the two directions' ``k``), else the optimal fractional
    packing (``units`` 1). ``None`` when there are no such edges or they fall short of the
    bound. Reductions reuse the allgather trees turned round when those are at the bound the
    other way (symmetric links)."""
    own = dedicated_edges(edges)
    if own is None:
        return None
    if len(own.src) == len(edges.src):
        exact = _exact(kind, edges, roots)
        if exact is not None:
            return (edges, *exact, "forest")
    down: tuple[WeightedTree, ...] = ()
    up: tuple[WeightedTree, ...] = ()
    if kind in DOWN:
        down = _packed(own, edges, roots)
        if down is None:
            return None
    if kind.reduces:
        reverse = own.reversed()
        full = edges.reversed()
        if down and at_bound(reverse, down, cut_bound(full, roots)):
            up = down
        else:
            up = _packed(reverse, full, roots)
            if up is None:
                return None
    return own, down, up, 1, "columns"


def _exact(
    kind: Collective, edges: LogicalEdges, roots: list[int] | None
) -> tuple[tuple[WeightedTree, ...], tuple[WeightedTree, ...], int] | None:
    """Exact packings of equal trees (:func:`~commflow.synth.forest.forest` at the bound)
    for the directions ``kind`` needs and the least common multiple of their tree counts;
    ``None`` when a direction has none."""
    exact = (Fraction(1),)
    down: tuple[WeightedTree, ...] = ()
    up: tuple[WeightedTree, ...] = ()
    units = 1
    found = None
    if kind in DOWN:
        found = forest(edges, roots, ratios=exact)
        if found is None:
            return None
        down, units = found.trees, found.k
    if kind.reduces:
        reverse = edges.reversed()
        back = None if found is None else mirror(found, reverse, roots)
        back = back or forest(reverse, roots, ratios=exact)
        if back is None:
            return None
        up, units = back.trees, math.lcm(units, back.k)
    return down, up, units


def _packed(
    own: LogicalEdges, edges: LogicalEdges, roots: list[int] | None
) -> tuple[WeightedTree, ...] | None:
    """The optimal fractional packing over ``own`` when it reaches the cut bound of all of
    ``edges``, else ``None`` (one column generation per edge set and roots within
    :func:`~commflow.synth.remember.remembered`: every pieces count and lowering shares it)."""
    seconds = own.seconds
    key = ("pack_trees", topology_key(own.topology), own.reverse, own.src.tobytes(),
           own.dst.tobytes(), seconds.data.tobytes(), seconds.indices.tobytes(),
           seconds.indptr.tobytes(), None if roots is None else tuple(roots))
    try:
        packing = recall(key, lambda: pack_trees(own, roots))
    except AlgorithmError:
        return None
    if packing.seconds_per_byte > cut_bound(edges, roots) * (1 + 1e-6):
        return None
    return packing.trees

