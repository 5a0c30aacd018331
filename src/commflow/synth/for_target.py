"""Synthesis for a runtime: the fastest program that the target loads and runs.

The default synthesized programs carry thousands of chunks per root, far beyond what MSCCL's
parsers take (256 or 64 steps per threadblock, 4,096 XML elements per file or per rank). On an
MSCCL-family target the runtime itself pipelines a large buffer by running the program in
loops of at most one kernel chunk per program chunk (:func:`commflow.ir.transform.repeat`), so
few pieces per share lose less than they would in one pass, and programs with one stream per
edge may gain from channels by tree depth (:func:`~commflow.synth.streams.lower_streams`'s
``levels``), whose loops overlap. Where a runtime counts XML elements per rank (RCCL,
msccl-executor), a program with one stream per edge and many pieces fits too once each
stream is cut into consecutive threadblocks of at most the runtime's steps per threadblock
(:func:`~commflow.ir.transform.split_channels`): at 1 GiB it runs in one loop of chunks under
2 MiB, whose pipeline fills and drains once; with each tree's chunks merged into larger
messages but where the trees fill and drain (:data:`MERGES`), it pipelines like more pieces
than fit as equal chunks; where the runtime caps threadblocks per rank (RCCL), a rank's
threadblocks that run one after the other share one (:func:`~commflow.ir.pack.
pack_channels`). A reduce-scatter lowered in shares across boxes
is also tried with its partials bound for another box first
(:func:`~commflow.synth.cross_box.cross_box_first`), which hides the last network hop.
Where Hamiltonian cycles load every link to its bandwidth (DGX-1), a ring packing
(:mod:`commflow.synth.rings`) reaches the tree packing's speed with one threadblock per ring
and every forward fused with its receive: few elements and nothing to fill but the ring's own
steps, so it is tried too.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from commflow.collectives import Collective, parse_collective
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import Program
from commflow.ir.msccl import to_msccl_xml
from commflow.ir.msccl_fit import element_budget, fused_pieces
from commflow.ir.pack import pack_channels
from commflow.ir.target import Target, get_target
from commflow.ir.transform import split_channels
from commflow.sim import simulate
from commflow.synth.api import synthesize
from commflow.synth.cross_box import cross_box_first
from commflow.synth.merge import Merge
from commflow.synth.remember import remembered
from commflow.synth.rings import COLLECTIVES as RING_COLLECTIVES
from commflow.synth.rings import ring_orders, ring_program
from commflow.topology.graph import Topology
from commflow.units import format_size

PIECES_TRIED = (64, 32, 16, 8, 4, 2, 1)
"""Chunks per share tried, most first."""

LEVELS = 8
"""Most channels per edge, by tree depth, of the stream programs tried."""

LEVELED_TRIED = 3
"""Fitting programs compared per lowering (the most pipelined first): with channels by depth
or with one stream per edge run in loops, fewer pieces are sometimes faster (DGX-1
allreduce on MSCCL: 1 piece per tree)."""

FEW_TREES = 4
"""Most trees per root of the packings lowered in shares that are tried besides the default
(DGX A100 x2: one tree per root, exact, instead of 13: 496 steps per piece, not 6,448)."""

SPLIT_PIECES = (60, 56, 52, 48, 40, 30, 28, 24)
"""Pieces per share also tried, within the range of ``pieces``, for streams cut into
threadblocks: their steps per rank approach the 4,096 elements RCCL and msccl-executor keep
(MI250 x2 allgather on RCCL: 48 pieces fit, 7.6% below the default synthesis; 32: 12.2%;
allreduce, whose chunks cross two trees, on msccl-executor: 30)."""

SPLIT_TRIED = 3
"""Fitting programs with streams cut into threadblocks compared (the most pipelined first):
a fractional packing's rounding differs from one count of pieces to the next (MI250 x2
reduce-scatter in one pass: 8.2% below the default synthesis at 56 pieces, 5.6% at 60,
7.5% at 52)."""

MERGES: dict[Collective, tuple[tuple[int, Merge, int], ...]] = {
    Collective.ALLGATHER: ((128, 2, 3), (128, 3, 4)),
    Collective.REDUCESCATTER: ((128, (1, 1, 1, 2, 2), 3), (128, (1, 1, 2, 2), 3)),
    Collective.ALLREDUCE: ((128, (2, 3, 4), 7), (128, (2, 4), 6)),
}
"""Per collective, ``(pieces, head, group)`` of the merged stream programs also tried with
streams cut into threadblocks (:func:`~commflow.synth.merge.merged`): ``pieces`` chunks
per root's data, each tree's sent ``group`` at a time but in messages of the ``head`` sizes
at either end (an int: that many single chunks), so a program pipelines like ``pieces`` in
about as many steps as fewer equal chunks take. The first of each collective is the best
found on MI250 x2's msccl-executor at 1 GiB with a power of two chunks per root (so that
``nchunksperloop`` divides every power-of-two size it runs at), the second on RCCL where the
first does not fit, against the default synthesis: allgather 1.44% on both (RCCL: packed,
:data:`PACK_EARLY`; the second wins on DGX-1 without rings), reduce-scatter 1.61% / 1.90%
(packed), allreduce 1.92% / 1.97% (packed)."""

SPLIT_SIXTEENTHS = (15, 14, 12)
"""Messages per threadblock a cut stream is given, in sixteenths of the target's steps per
threadblock, tried in turn (room for the ``nop`` steps that carry extra dependencies)."""

PACK_EARLY = ("lower", "higher")
"""Where a target caps threadblocks per rank (RCCL: 64) and a cut program needs more, it is
also tried with its threadblocks packed (:func:`~commflow.ir.pack.pack_channels`), the
shorter segment first on the streams from a lower-numbered rank to a higher one, then on the
others (:func:`~commflow.ir.transform.split_channels`'s ``early``): short segments at the
start of one stream then share a threadblock with short ones at the end of another, at the
same simulated times (MI250 x2 reduce-scatter, 128 chunks per root merged ``(1, 1, 2, 2)``:
3, cut at 60: 63 threadblocks per rank at most instead of 66)."""

RING_CHUNKS = (2, 1)
"""Chunks per ring tried for ring packings (:mod:`commflow.synth.rings`): with 3 or more a
ring posts more sends before its first receive than a connection's slots hold (MSCCL
Simple: two chunks), which the target's verification refuses."""

REFERENCE_SIZE = 1 << 30
"""Bytes at which candidates are compared by default (large messages)."""


@remembered()
def synthesize_for(
    collective: Collective | str,
    topology: Topology,
    target: Target | str,
    *,
    root: int = 0,
    pieces: tuple[int, ...] = PIECES_TRIED,
    size: float = REFERENCE_SIZE,
    max_loss: float | None = None,
    rings: bool = True,
    merges: tuple[tuple[int, Merge, int], ...] | None = None,
) -> tuple[Program, str]:
    """The bandwidth-synthesized program that exports to ``target`` (verified there, bounded
    buffers and limits included) and runs fastest there at ``size`` bytes, and its MSCCL XML.

    Candidates: the ring packing (:func:`~commflow.synth.rings.ring_program`, each of
    :data:`RING_CHUNKS`) where there is one and ``rings`` is true, and tree programs, each
    the most pipelined that fit (most ``pieces`` first): up to :data:`LEVELED_TRIED` as
    synthesized, and where the synthesis lowers with one stream per
    edge, up to :data:`LEVELED_TRIED` with channels by tree depth (:data:`LEVELS` per edge at
    most) and, on targets that cap steps per
    threadblock, up to :data:`SPLIT_TRIED` with every stream cut into threadblocks of at most
    that many messages (also trying :data:`SPLIT_PIECES`), and each of ``merges`` (``(pieces,
    head, group)``; default: the collective's :data:`MERGES`) cut so, a cut program that
    needs more threadblocks than the target runs also with them packed (:data:`PACK_EARLY`);
    where it lowers in shares, up to
    :data:`LEVELED_TRIED` with at most :data:`FEW_TREES` trees per root; a reduce-scatter
    lowered in shares across boxes also with partials bound for another box first. Each is
    simulated with the flow model on the target (its loops and bounded buffers). Raises
    ``AlgorithmError`` naming the target and the last refusal when none fits, and, with
    ``max_loss`` (a fraction: 0.02 for 2%), when the fastest that fits runs more than that
    below the default synthesis at ``size`` (flow model, one pass), with the numbers: its
    speed, the elements its XML holds against the parser's limit, and about how many pieces
    would fit with every receive fused with its forward
    (:func:`~commflow.ir.msccl_fit.fused_pieces`). Runs within
    :func:`~commflow.synth.remember.remembered`: the families share their syntheses, and so do
    the calls of an enclosing block (targets, size ranges).
    """
    where = get_target(target)
    reason = "no pieces tried"
    fitted: list[tuple[Program, str]] = []
    cap = where.max_steps_per_threadblock
    cuts = () if cap is None else tuple(cap * f // 16 for f in SPLIT_SIXTEENTHS)
    finer = sorted({*pieces, *(c for c in SPLIT_PIECES if min(pieces) <= c <= max(pieces))},
                   reverse=True)
    kind = parse_collective(collective)
    merges = MERGES.get(kind, ()) if merges is None else merges
    families = (({}, (None,), LEVELED_TRIED, pieces),
                ({"levels": LEVELS}, (None,), LEVELED_TRIED, pieces),
                ({}, cuts, SPLIT_TRIED, finer),
                *(({"merge": (head, group)}, cuts, 1, (count,))
                  for count, head, group in merges if cuts),
                ({"trees": FEW_TREES}, (None,), LEVELED_TRIED, pieces))

    def fit(program: Program) -> bool:
        """Keep ``program`` with its XML if it exports to the target, else the refusal."""
        nonlocal reason
        try:
            fitted.append((program, to_msccl_xml(program, where)))
        except ProgramError as error:
            reason = str(error)
            return False
        return True

    orders = ring_orders(topology) if rings and kind in RING_COLLECTIVES else None
    for chunks in RING_CHUNKS if orders else ():
        fit(ring_program(collective, topology, chunks=chunks, orders=orders))
    for extra, splits, wanted, counts in families:
        found = 0
        for count in counts:
            program = synthesize(collective, topology, pieces=count, root=root, **extra)
            streams = dict(program.params).get("lowering") == "streams"
            if ("trees" in extra) == streams and (extra or splits != (None,)):
                break  # levels and cuts apply to one stream per edge, trees to shares only
            for split in splits:
                candidate = program if split is None else split_channels(program, split)
                if split is not None and "split" not in dict(candidate.params):
                    break  # no stream longer than a threadblock: a candidate above
                fits = any([fit(variant) for variant in _orders(candidate, topology, streams)])
                if split and not fits and _crowded(candidate, where):
                    fits = any(fit(variant) for variant in _packed(program, split, topology,
                                                                   where, size))
                if fits:
                    found += 1
                    break
            if found == wanted:
                break
    if not fitted:
        raise AlgorithmError(
            f"no synthesized {collective} program for {topology.name} fits {where.describe()} "
            f"with {min(pieces)}..{max(pieces)} pieces per share; the last refusal: {reason}")
    best = fitted[0] if len(fitted) == 1 else min(
        fitted, key=lambda c: simulate(c[0], topology, size, model="flow", target=where).time)
    if max_loss is not None:
        default = synthesize(collective, topology, root=root)
        _check_loss(best, default, topology, where, size, max_loss)
    return best


def lowering_loss(program: Program, default: Program, topology: Topology,
                  target: Target | str, size: float = REFERENCE_SIZE) -> float:
    """How much slower ``program`` runs on ``target`` than ``default`` runs in one pass
    without any runtime limit, at ``size`` bytes (flow model): ``1 - algbw / default's
    algbw`` (0.0242: 2.42% below)."""
    got, ideal = _algbws(program, default, topology, target, size)
    return 1 - got / ideal


def _algbws(program: Program, default: Program, topology: Topology, target: Target | str,
            size: float) -> tuple[float, float]:
    """``program``'s algbw on ``target`` and ``default``'s in one pass without limits (B/s)."""
    return (simulate(program, topology, size, model="flow", target=target).algbw,
            simulate(default, topology, size, model="flow").algbw)


def _check_loss(best: tuple[Program, str], default: Program, topology: Topology,
                where: Target, size: float, max_loss: float) -> None:
    """Raise ``AlgorithmError`` with the numbers when ``best`` (program, XML) runs more than
    ``max_loss`` below ``default`` at ``size`` (see :func:`synthesize_for`)."""
    program, xml = best
    got, ideal = _algbws(program, default, topology, where, size)
    loss = 1 - got / ideal
    if loss <= max_loss:
        return
    raise AlgorithmError(
        f"{program.collective.value} on {topology.name}: the fastest synthesized program "
        f"{where.name} loads ({lowered_shape(program)}) runs at {got / 1e9:.2f} GB/s at "
        f"{format_size(size)}, {100 * loss:.2f}% below the default synthesis' "
        f"{ideal / 1e9:.2f} GB/s, more than the {100 * max_loss:.2f}% allowed"
        f"{_room(program, xml, where)}")


def lowered_shape(program: Program) -> str:
    """How a program :func:`synthesize_for` returns is cut: ``6 rings of 2 chunks each``, or
    ``48 pieces per root, split 56`` (pieces per tree, root's data or share; channels per
    edge by depth as ``levels``, messages per threadblock as ``split``)."""
    params = dict(program.params)
    if params.get("packing") == "cycles":
        return f"{params['rings']} rings of {params['chunks']} chunks each"
    pieces = int(params.get("pieces", 1))
    many = "piece" if pieces == 1 else "pieces"
    how = "".join(f", {k} {params[k]}" for k in ("levels", "merge", "split", "order")
                  if k in params)
    return f"{pieces} {many} per {_unit(params)}{how}"


def _unit(params: dict) -> str:
    """What a tree program's ``pieces`` count per: streams, a tree of an exact packing or a
    root's data; else a share."""
    if params.get("lowering") == "streams":
        return "tree" if params.get("packing") == "forest" else "root"
    return "share"


def _room(program: Program, xml: str, where: Target) -> str:
    """For a tree program on a target that caps XML elements: the elements its XML holds
    against the cap and about how many pieces would fit fully fused; else nothing."""
    params = dict(program.params)
    budget = element_budget(program, where)
    if budget is None or params.get("packing") == "cycles":
        return ""
    ranks = [g.count("<tb ") + g.count("<step ") for g in xml.split("<gpu ")[1:]]
    used, scope = (max(ranks), "for one rank") if where.nodes_per_rank else (sum(ranks),
                                                                             "per file")
    pieces = int(params.get("pieces", 1))
    return (f"; its XML holds {used:,} of the {budget:,} <tb> and <step> elements "
            f"{where.name}'s parser keeps {scope}, and with every receive fused with the send "
            f"of what it wrote (rcs/rrcs) about {fused_pieces(program, where, pieces):,} "
            f"pieces per {_unit(params)} would fit")


def _crowded(program: Program, where: Target) -> bool:
    """Whether some rank of ``program`` has more channels than ``where`` runs threadblocks
    (a cut stream's segments are a threadblock each)."""
    t = program.table
    most = int(np.bincount(t.part[t.channel_starts[:-1]]).max(initial=0))
    return where.max_threadblocks is not None and most > where.max_threadblocks


def _packed(program: Program, split: int, topology: Topology, where: Target,
            size: float) -> Iterator[Program]:
    """``program`` cut into threadblocks of ``split`` messages with its threadblocks packed
    by their times on ``where`` at ``size`` bytes, the shorter segment first on its streams
    from a lower-numbered rank to a higher one, then from a higher to a lower
    (:data:`PACK_EARLY`); nothing when it runs there in several loops (each threadblock
    loops on its own, so joined ones would wait for each other's loops) or cuts steps into
    several messages (the times are of the cut steps)."""
    n = program.nranks
    chans = np.unique(program.table.chan)
    streams = chans[chans < n * n]
    for early in PACK_EARLY:
        chosen = streams[(streams // n < streams % n) == (early == "lower")]
        cut = split_channels(program, split, early=chosen.tolist())
        finish = simulate(cut, topology, size, model="flow", target=where).finish
        if len(finish) != cut.nsteps:
            return
        yield pack_channels(cut, finish, split)


def _orders(program: Program, topology: Topology, streams: bool) -> list[Program]:
    """``program``, and for a reduce-scatter lowered in shares across boxes also its variant
    with partials bound for another box first (:func:`~commflow.synth.cross_box.
    cross_box_first`; DGX A100 x2: at the allgather's pace)."""
    if streams or program.collective is not Collective.REDUCESCATTER or topology.nboxes < 2:
        return [program]
    return [program, cross_box_first(program, topology)]
