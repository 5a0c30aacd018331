"""How few MSCCL XML elements a program could take, whatever the export: a bound that says
when a program cannot fit a runtime's parser even with every possible fused step.

Each MSCCL step moves one message or does one local operation; fused steps (``rcs``,
``rrcs``) run a receive and the send of what it wrote as one step. A send can fuse with one
receive at most and the other way round, and only with a receive that wrote exactly the
chunks the send reads, so the fused steps of a rank are at most, summed over the chunk
references it receives into, the fewer of the receives writing that reference and the sends
reading it. A rank also needs a threadblock (``<tb>``) per peer it sends to or per peer it
receives from, whichever are more: a threadblock has one send peer and one receive peer.
``nop`` steps and threadblocks beyond those only add, so :func:`least_elements` is a lower
bound on what any export of the program writes.
"""

from __future__ import annotations

import numpy as np

from commflow.errors import ProgramError
from commflow.ir.program import Program
from commflow.ir.step import Op
from commflow.ir.target import Target


def least_elements(program: Program) -> np.ndarray:
    """Per rank, the fewest ``<tb>`` and ``<step>`` elements any MSCCL export of
    ``program`` holds (see the module): its steps, less the most sends that could run fused
    with a receive, plus the threadblocks its peers need."""
    t = program.table
    n = program.nranks
    part = t.part.astype(np.int64)
    ranks = part < n
    steps = np.bincount(part[ranks], minlength=n)
    writes = ranks & ((t.op == Op.RECV) | (t.op == Op.RECV_REDUCE))
    reads = ranks & (t.op == Op.SEND)
    ref = ((part * 3 + t.dst_buf) * (1 << 32) + t.dst_off) * 128 + t.count
    sent = ((part * 3 + t.src_buf) * (1 << 32) + t.src_off) * 128 + t.count
    keys, inverse = np.unique(np.concatenate((ref[writes], sent[reads])), return_inverse=True)
    nw = int(writes.sum())
    got = np.bincount(inverse[:nw], minlength=len(keys))
    out = np.bincount(inverse[nw:], minlength=len(keys))
    owner = keys // 128 // (1 << 32) // 3
    fused = np.bincount(owner, weights=np.minimum(got, out), minlength=n).astype(np.int64)
    peers = []
    for mask in (reads, writes):
        pairs = np.unique(part[mask] * (n + 1) + t.peer[mask])
        peers.append(np.bincount(pairs // (n + 1), minlength=n))
    return steps - fused + np.maximum(*peers)


def element_budget(program: Program, target: Target) -> int | None:
    """``<tb>`` and ``<step>`` elements ``target``'s parser keeps for ``program`` (per rank
    when it counts the loading rank's only, else for the whole file), after the ``<algo>``
    and ``<gpu>`` elements; ``None`` without a limit."""
    if target.max_nodes is None:
        return None
    return target.max_nodes - 1 - len(program.participants)


def _least_counted(program: Program, target: Target) -> int:
    """:func:`least_elements` as ``target``'s parser counts them: the busiest rank's, or the
    whole file's."""
    least = least_elements(program)
    return int(least.max() if target.nodes_per_rank else least.sum())


def fused_pieces(program: Program, target: Target, pieces: int) -> int | None:
    """About how many pieces (in the unit ``program`` was made with, ``pieces`` of them)
    would fit ``target``'s element limit with every possible fused step: the limit over
    :func:`least_elements` per piece (the busiest rank where the parser counts one rank's
    elements, the whole file otherwise), rounded down; ``None`` without a limit. Elements
    grow about linearly with the pieces, so this is an estimate for other counts."""
    budget = element_budget(program, target)
    if budget is None:
        return None
    return int(budget * pieces // max(_least_counted(program, target), 1))


def check_elements(program: Program, target: Target) -> None:
    """Raise ``ProgramError`` when even the fewest elements any export of ``program`` holds
    (:func:`least_elements`, with the ``<algo>`` and ``<gpu>`` elements) exceed what
    ``target``'s parser keeps: refused before a threadblock is laid out."""
    budget = element_budget(program, target)
    if budget is None:
        return
    used = _least_counted(program, target)
    if used > budget:
        scope = "for one rank" if target.nodes_per_rank else "per file"
        raise ProgramError(
            f"{program.name}: the XML would hold at least {used + 1 + len(program.participants)}"
            f" elements {scope} where {target.name}'s parser keeps {target.max_nodes}; lower "
            "the pipelining (fewer --chunks, --channels or synthesis --pieces)")
