"""On an XML target a send that the export fuses with the receive before it (``rcs``) holds
that receive until the send has room, as MSCCL's fused step does; where that would
deadlock, the export writes the two apart and the simulator times them so."""

from __future__ import annotations

import numpy as np
import pytest

from commflow.algorithms import build
from commflow.collectives import Collective
from commflow.errors import DeadlockError
from commflow.ir.build import ProgramBuilder
from commflow.ir.msccl import fused_sends, to_msccl_xml
from commflow.ir.step import Buffer, Op, Ref
from commflow.ir.target import bounded, get_target
from commflow.sim import MODELS, simulate
from commflow.topology import ring

CHUNK = 2 << 20
"""Bytes of a chunk: one loop of MSCCL's Simple protocol, two to a connection."""
LINK, COPY = 10e9, 1e9
"""Bytes/s of every link and of a local copy."""


def slow_sink(chunks: int = 4):
    """Broadcast along 0 -> 1 -> 2 whose last rank copies each chunk away before it takes
    the next: rank 1's forwards are written fused, and wait for room at rank 2."""
    b = ProgramBuilder(Collective.BROADCAST, 3, chunk_factor=chunks, name="slow-sink")
    for i in range(chunks):
        b.send(0, 1, Ref(Buffer.INPUT, i))
        b.recv(1, 0, Ref(Buffer.OUTPUT, i))
        b.send(1, 2, Ref(Buffer.OUTPUT, i))
        b.recv(2, 1, Ref(Buffer.OUTPUT, i))
        b.copy(2, Ref(Buffer.OUTPUT, i), Ref(Buffer.SCRATCH, i))
    for i in range(chunks):  # one chunk a step: the steps keep their indices when timed
        b.copy(0, Ref(Buffer.INPUT, i), Ref(Buffer.OUTPUT, i), channel=1)
    return b.build()


def test_the_fused_sends_are_the_exports_rcs_steps():
    for program in (build("allreduce", "ring", 8), build("broadcast", "ring", 5, chunks=3),
                    slow_sink()):
        xml = to_msccl_xml(program, "msccl")
        fused = fused_sends(program, "msccl")
        assert len(fused) == xml.count('type="rcs"') + xml.count('type="rrcs"') > 0
        t = program.table
        assert (t.op[fused] == Op.SEND).all() and (t.chan[fused - 1] == t.chan[fused]).all()
    assert len(fused_sends(build("allreduce", "ring", 8), "live")) == 0
    wide = build("allgather", "ring", 16, chunks=2, channels=8)
    assert len(fused_sends(wide, "msccl")) == 0  # beyond the file's elements: not exported


@pytest.mark.parametrize("model", MODELS)
def test_a_fused_receive_completes_once_its_send_has_room(model):
    """Rank 1's fourth forward has room once rank 2 took the second chunk, after copying the
    first away: its receive ends at 2 transfers + 1 copy, not on arrival (4 transfers)."""
    program = slow_sink()
    result = simulate(program, ring(3, bandwidth=LINK, latency=0.0), 4 * CHUNK, model=model,
                      target="msccl", copy_bandwidth=COPY)
    receives = np.flatnonzero((program.table.part == 1) & (program.table.op == Op.RECV))
    hop, copy = CHUNK / LINK, CHUNK / COPY
    assert result.finish[receives] == pytest.approx([hop, 2 * hop, 3 * hop, 2 * hop + copy])
    live = simulate(program, ring(3, bandwidth=LINK, latency=0.0), 4 * CHUNK, model=model,
                    copy_bandwidth=COPY)
    assert live.finish[receives] == pytest.approx([hop, 2 * hop, 3 * hop, 4 * hop])


def fused_cycle():
    """Rank 1 fills its connection to rank 2, then forwards B fused; rank 2 takes nothing
    from rank 1 before rank 0's last message, which waits for room behind B."""
    b = ProgramBuilder(Collective.BROADCAST, 3, chunk_factor=6, name="fused-cycle")
    for i in (0, 1):
        b.send(1, 2, Ref(Buffer.SCRATCH, i))
    b.recv(1, 0, Ref(Buffer.OUTPUT, 2))
    b.send(1, 2, Ref(Buffer.OUTPUT, 2))
    for i in (2, 3, 4, 5):  # B, then D, E to rank 1, then C to rank 2
        b.send(0, 2 if i == 5 else 1, Ref(Buffer.INPUT, i))
    for i in (3, 4):
        b.recv(1, 0, Ref(Buffer.OUTPUT, i))
    b.recv(2, 0, Ref(Buffer.OUTPUT, 5))
    for i in (0, 1, 2):
        b.recv(2, 1, Ref(Buffer.OUTPUT, i))
    return b.build()


def test_forwards_that_would_deadlock_fused_are_timed_apart():
    program = fused_cycle()
    fused = fused_sends(program, "msccl")
    assert len(fused) == 1
    msccl, topology = get_target("msccl"), ring(3, bandwidth=LINK, latency=0.0)
    with pytest.raises(DeadlockError):
        simulate(bounded(program, msccl, chunk_bytes=CHUNK, fused=fused), topology, 6 * CHUNK)
    result = simulate(program, topology, 6 * CHUNK, model="flow", target=msccl)
    # B arrived long before: its receive ends as soon as its two sends before it are out
    assert result.finish[fused - 1] == pytest.approx(2 * CHUNK / LINK)


def chain(chunks: int = 4):
    """Broadcast along 0 -> 1 -> 2 in one step of ``chunks`` chunks per hop (``cnt``), rank
    1's forward fused with its receive (``rcs``)."""
    b = ProgramBuilder(Collective.BROADCAST, 3, chunk_factor=chunks, name="chain")
    b.send(0, 1, Ref(Buffer.INPUT, 0, chunks))
    b.recv(1, 0, Ref(Buffer.OUTPUT, 0, chunks))
    b.send(1, 2, Ref(Buffer.OUTPUT, 0, chunks))
    b.recv(2, 1, Ref(Buffer.OUTPUT, 0, chunks))
    b.copy(0, Ref(Buffer.INPUT, 0, chunks), Ref(Buffer.OUTPUT, 0, chunks), channel=1)
    return b.build()


@pytest.mark.parametrize("model", MODELS)
def test_a_step_of_chunks_larger_than_a_message_is_forwarded_message_by_message(model):
    """With 2 MiB chunks MSCCL sends a ``cnt=4`` step as 4 messages and the fused forward
    passes each on once it has it: 4 + 1 transfers of a chunk; with 512 KiB chunks the 4
    fill one message (``mscclMaxAllowedCount`` 4), received whole before it is forwarded: 2
    transfers of 4 chunks; unbounded (``live``) the step is one message at any size."""
    program = chain()
    assert 'type="rcs"' in to_msccl_xml(program, "msccl")
    topology = ring(3, bandwidth=LINK, latency=0.0)
    for chunk, transfers in ((CHUNK, 5), (CHUNK / 4, 8)):
        result = simulate(program, topology, 4 * chunk, model=model, target="msccl")
        assert result.time == pytest.approx(transfers * chunk / LINK)
        live = simulate(program, topology, 4 * chunk, model=model)
        assert live.time == pytest.approx(8 * chunk / LINK)
