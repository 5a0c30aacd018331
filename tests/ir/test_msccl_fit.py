"""The fewest MSCCL XML elements a program needs with every possible fused step: exact on
rings (what the export writes), never above any export, and counted by hand on a tree."""

from __future__ import annotations

import numpy as np
import pytest

from commflow.collectives import Collective
from commflow.errors import VerificationError
from commflow.ir import ProgramBuilder, inp, out, to_msccl_xml
from commflow.ir.msccl_fit import element_budget, fused_pieces, least_elements
from commflow.ir.target import get_target
from commflow.synth import synthesize
from commflow.topology import dgx1

from .programs import ring_allgather, ring_allreduce
from .test_msccl import registered


def exported(text: str) -> np.ndarray:
    """``<tb>`` and ``<step>`` elements of each ``<gpu>`` of an export."""
    return np.array([g.count("<tb ") + g.count("<step ") for g in text.split("<gpu ")[1:]])


def forked_broadcast():
    """4 ranks: 0 sends to 1, which forwards to 2 and 3 (one chunk)."""
    b = ProgramBuilder(Collective.BROADCAST, 4, chunk_factor=1, name="fork")
    b.copy(0, inp(0), out(0))
    b.send(0, 1, out(0))
    b.recv(1, 0, out(0))
    b.send(1, 2, out(0))
    b.send(1, 3, out(0))
    b.recv(2, 1, out(0))
    b.recv(3, 1, out(0))
    return b.build()


@pytest.mark.parametrize(("program", "each"), [
    (ring_allgather(4), 6),    # cpy, s, rcs, rcs, r and one <tb>
    (ring_allreduce(8), 16),   # s, 7 rrcs, 6 rcs, r and one <tb>
])
def test_rings_need_exactly_what_the_export_writes(program, each):
    assert least_elements(program).tolist() == [each] * program.nranks
    assert exported(to_msccl_xml(program)).tolist() == [each] * program.nranks


def test_a_received_chunk_fuses_with_one_of_its_forwards():
    # rank 0: cpy, s and a <tb>; rank 1: recv + 2 sends of which one fuses (rcs, s), and
    # its 2 send peers need 2 threadblocks; ranks 2, 3: r and a <tb>
    program = forked_broadcast()
    assert least_elements(program).tolist() == [2 + 1, 2 + 2, 1 + 1, 1 + 1]
    assert (exported(to_msccl_xml(program)) >= least_elements(program)).all()


def test_no_export_holds_fewer():
    programs = [*registered(8), *registered(8, chunks=2, channels=2),
                synthesize("allgather", dgx1(), pieces=1, levels=8),
                synthesize("allreduce", dgx1(), pieces=1, levels=6)]
    checked = 0
    for program in programs:
        try:
            text = to_msccl_xml(program, "rccl")
        except VerificationError:
            continue
        least = least_elements(program)
        assert (exported(text) >= least).all(), program.name
        checked += 1
    assert checked >= 10


def test_budget_and_fused_pieces():
    program = ring_allreduce(8)  # 16 elements per rank, 128 in the file
    assert element_budget(program, get_target("rccl")) == 4096 - 1 - 8
    assert element_budget(program, get_target("live")) is None
    assert fused_pieces(program, get_target("rccl"), 1) == 4087 // 16
    assert fused_pieces(program, get_target("msccl"), 2) == 4087 * 2 // 128
    assert fused_pieces(program, get_target("live"), 1) is None
