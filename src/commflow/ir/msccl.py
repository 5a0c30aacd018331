"""Export of a program as MSCCL XML (``<algo>`` / ``<gpu>`` / ``<tb>`` / ``<step>``).

This module holds the entry point, :func:`to_msccl_xml`: its checks, verification on the target
and the ``<algo>`` element. How channels become threadblocks, what their steps wait on and the
step types (the ``<gpu>``, ``<tb>`` and ``<step>`` elements) are in
:mod:`commflow.ir.msccl_threadblocks`.

The export is for a :class:`~commflow.ir.target.Target` (``msccl``: MSCCL on NCCL 2.12,
``MSCCL_XML_FILES``; ``msccl-executor`` and ``rccl``, ``MSCCL_ALGO_DIR``), which gives the
collective names (``reduce_scatter`` in MSCCL 2.12, ``reducescatter`` in the others, gather and
scatter only in the others), bounded buffers (the program is verified on the target first, so a
program whose sends would block each other forever is refused) and the parsers' limits (steps
per threadblock, threadblocks per rank, channels, 8-bit ``depid``, elements per file), refused
with a message naming the limit. ``minBytes``/``maxBytes`` come from the caller's size range
(default 0 to 1 GiB: never 2**63, from which MSCCL 2.12 sizes its scratch buffer). XML has no
root: rooted programs are exported for root 0 only. Programs are out of place
(``inplace="0" outofplace="1"``). ``nchunksperloop`` counts the chunks in the elements the
runtime divides among them (``count`` times its size multiplier): the larger of a rank's input
and output, or one block (``chunk_factor`` chunks) for gather and scatter, whose ``count`` is
one rank's block.
"""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

import numpy as np

from commflow.collectives import Collective
from commflow.errors import ProgramError, VerificationError
from commflow.ir.msccl_fit import check_elements
from commflow.ir.msccl_threadblocks import ThreadblockWriter, forwards
from commflow.ir.program import Program
from commflow.ir.step import ParticipantKind
from commflow.ir.target import Target, bounded, get_target
from commflow.ir.verify import verify

DEFAULT_MAX_BYTES = 1 << 30
"""``maxBytes`` when none is given: 1 GiB (MSCCL 2.12 sizes its scratch from it)."""


def to_msccl_xml(
    program: Program,
    target: Target | str = "msccl",
    *,
    proto: str = "Simple",
    min_bytes: int = 0,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> str:
    """The program as MSCCL XML for ``target`` (``msccl``, ``msccl-executor``, ``rccl`` or a
    :class:`~commflow.ir.target.Target`; see the module docstring).

    ``proto`` is the NCCL protocol (``Simple``, ``LL``, ``LL128``) when ``target`` is a name.
    ``min_bytes``/``max_bytes`` bound the sizes (bytes, nccl-tests convention) at which the
    runtime may pick the program. The program is first verified on the target, bounded buffers
    included. Raises ``ProgramError`` for programs with switch participants, collectives or
    rooted programs the runtime cannot run, a size range that is empty or unbounded, and
    programs beyond the target's limits (steps per threadblock, threadblocks, channels,
    ``depid``, elements per file), naming the limit and what to change; ``VerificationError``
    when the program is wrong or would deadlock there.
    """
    where = get_target(target, protocol=proto)
    coll = _runs_there(program, where)
    if not 0 <= min_bytes <= max_bytes or max_bytes >= 1 << 62:
        raise ProgramError(
            f"{program.name}: size range [{min_bytes}, {max_bytes}] bytes must satisfy "
            "0 <= min_bytes <= max_bytes < 2**62 (MSCCL sizes scratch from maxBytes)")
    check_elements(program, where)
    writer = ThreadblockWriter(program, where, fuse=True)
    gpus = writer.gpus()  # the target's limits first: they cost less than verifying
    verify(program, target=where, max_bytes=max_bytes)
    if writer.fused_sends:
        try:
            verify(bounded(program, where, chunk_bytes=program.chunk_bytes(max_bytes),
                           fused=np.array(writer.fused_sends)))
        except VerificationError:  # a fused step holds its receive until its send has room
            writer = ThreadblockWriter(program, where, fuse=False)
            gpus = writer.gpus()
    lines = [
        f'<algo name={quoteattr(program.name)} proto="{where.protocol}" '
        f'nchannels="{writer.nchannels}" '
        f'nchunksperloop="{chunks_per_loop(program)}" ngpus="{program.nranks}" '
        f'coll="{coll}" inplace="0" outofplace="1" minBytes="{min_bytes}" '
        f'maxBytes="{max_bytes}">',
        *gpus,
        "</algo>\n",
    ]
    return "\n".join(lines)


def _runs_there(program: Program, where: Target) -> str:
    """The ``coll`` name ``where``'s runtime runs ``program`` under; ``ProgramError`` for a
    target that reads no XML, switch participants, a collective it lacks or another root."""
    if not where.collective_names:
        raise ProgramError(
            f"{program.name}: target {where.name!r} reads no XML; use one of msccl, "
            "msccl-executor, rccl")
    if any(p.kind is not ParticipantKind.RANK for p in program.participants):
        raise ProgramError(
            f"{program.name}: MSCCL has no in-network participants; export a "
            "program whose participants are all ranks"
        )
    coll = where.collective_names.get(program.collective)
    if coll is None:
        known = ", ".join(c.value for c in where.collective_names)
        raise ProgramError(
            f"{program.name}: the {where.name} runtime has no {program.collective.value} "
            f"collective (it runs {known}); export for another target"
        )
    if program.root not in (None, 0):
        raise ProgramError(
            f"{program.name}: MSCCL XML carries no root, and the runtimes pick an algorithm "
            f"whatever the call's root; a program for root {program.root} would run for "
            "every root. Build the program for root 0 and call it with root 0")
    return coll


def fused_sends(program: Program, target: Target | str) -> np.ndarray:
    """Global indices of the sends :func:`to_msccl_xml` lays out fused with the receive
    before them (``rcs``/``rrcs``) when ``program`` fits ``target`` (it still writes them
    apart where the fused steps would deadlock); none when it does not export there."""
    if not forwards(program).any():  # no send forwards its receive: nothing to lay out
        return np.zeros(0, dtype=np.int64)
    where = get_target(target)
    try:
        _runs_there(program, where)
        check_elements(program, where)
        writer = ThreadblockWriter(program, where, fuse=True)
        writer.gpus(text=False)
    except ProgramError:
        return np.zeros(0, dtype=np.int64)
    return np.array(writer.fused_sends, dtype=np.int64)


def chunks_per_loop(program: Program) -> int:
    """MSCCL's ``nchunksperloop``: chunks in the ``count x sizeMultiplier`` elements the
    runtime splits: a rank's whole input or output, except for gather and scatter, whose
    count is one rank's block."""
    if program.collective in (Collective.GATHER, Collective.SCATTER):
        return program.chunk_factor
    return max(program.expected_buffers())
