"""Synthesis for a runtime: the most pipelined program that the target loads and runs.

The default synthesized programs carry thousands of chunks per root, far beyond what MSCCL's
parsers take (256 or 64 steps per threadblock, 4,096 XML elements per file or per rank). On an
MSCCL-family target the runtime itself pipelines a large buffer by running the program in
loops of at most one kernel chunk per program chunk (:func:`commflow.ir.transform.repeat`), so
few pieces per share lose less than they would in one pass.
"""

from __future__ import annotations

from commflow.collectives import Collective
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import Program
from commflow.ir.msccl import to_msccl_xml
from commflow.ir.target import Target, get_target
from commflow.synth.api import synthesize
from commflow.topology.graph import Topology

PIECES_TRIED = (64, 32, 16, 8, 4, 2, 1)
"""Chunks per share tried, most first."""


def synthesize_for(
    collective: Collective | str,
    topology: Topology,
    target: Target | str,
    *,
    root: int = 0,
    pieces: tuple[int, ...] = PIECES_TRIED,
) -> tuple[Program, str]:
    """The bandwidth-synthesized program with the most ``pieces`` that exports to ``target``
    (verified there, bounded buffers and limits included), and its MSCCL XML.

    Raises ``AlgorithmError`` naming the target and the last refusal when none fits.
    """
    where = get_target(target)
    reason = "no pieces tried"
    for count in pieces:
        program = synthesize(collective, topology, pieces=count, root=root)
        try:
            return program, to_msccl_xml(program, where)
        except ProgramError as error:
            reason = str(error)
    raise AlgorithmError(
        f"no synthesized {collective} program for {topology.name} fits {where.describe()} "
        f"with {min(pieces)}..{max(pieces)} pieces per share; the last refusal: {reason}")
