"""The verifier accepts correct programs and rejects each class of broken ones, naming where."""

from __future__ import annotations

import pytest

from commflow.collectives import Collective
from commflow.errors import ProgramError, VerificationError
from commflow.ir import ProgramBuilder, inp, out, scr, verify

from .programs import ring_allgather, ring_allreduce, two_channel_allgather


@pytest.mark.parametrize("n", range(1, 10))
def test_hand_written_programs_verify(n):
    verify(ring_allgather(n))
    verify(ring_allreduce(n))
    verify(two_channel_allgather(n))


def _builder(coll=Collective.ALLREDUCE, n=2, cf=1, root=None):
    return ProgramBuilder(coll, n, chunk_factor=cf, name="t", root=root)


def test_deadlock_is_reported_with_location():
    b = _builder()
    b.recv_reduce(0, 1, inp(0), out(0))
    b.send(0, 1, out(0))
    b.recv_reduce(1, 0, inp(0), out(0))
    b.send(1, 0, out(0))
    with pytest.raises(VerificationError, match="deadlock") as err:
        verify(b.build())
    assert err.value.step == 0 and err.value.rank in (0, 1)


def test_unmatched_send_is_a_mismatch():
    b = _builder(Collective.ALLGATHER, 2)
    for r in range(2):
        b.copy(r, inp(0), out(r))
        b.send(r, 1 - r, out(r))
        b.recv(r, 1 - r, out(1 - r))
    b.send(0, 1, out(0))
    with pytest.raises(VerificationError, match="sends 2 message.*receives 1") as err:
        verify(b.build())
    assert err.value.rank == 0 and err.value.channel == 0


def test_count_mismatch_between_send_and_recv():
    b = _builder(Collective.ALLGATHER, 2, cf=2)
    b.send(0, 1, inp(0, 2))
    b.recv(1, 0, out(0, 1))
    with pytest.raises(VerificationError, match="receives 1 chunk"):
        verify(b.build())


def test_double_counting_names_the_chunk():
    b = _builder()
    b.send(0, 1, inp(0))
    b.send(0, 1, inp(0))
    b.recv_reduce(1, 0, inp(0), out(0))
    b.recv_reduce(1, 0, out(0), out(0))
    with pytest.raises(VerificationError, match="double counting") as err:
        verify(b.build())
    assert (err.value.rank, err.value.step, err.value.chunk) == (1, 1, ("output", 0))


def test_reducing_different_elements_is_rejected():
    b = _builder(cf=2)
    b.send(0, 1, inp(1))
    b.recv_reduce(1, 0, inp(0), out(0))
    with pytest.raises(VerificationError, match="reduces different elements"):
        verify(b.build())


def test_reading_empty_chunk_is_missing_data():
    b = _builder(Collective.BROADCAST, 2, root=0)
    b.send(1, 0, inp(0))
    b.recv(0, 1, out(0))
    with pytest.raises(VerificationError, match="missing data") as err:
        verify(b.build())
    assert err.value.rank == 1 and err.value.chunk == ("input", 0)


def test_postcondition_names_rank_and_chunk():
    b = _builder(Collective.ALLGATHER, 2)
    for r in range(2):
        b.copy(r, inp(0), out(r))
    b.send(0, 1, out(0))
    b.recv(1, 0, out(0))
    with pytest.raises(VerificationError, match="postcondition") as err:
        verify(b.build())
    assert err.value.rank == 0 and err.value.chunk == ("output", 1)


def test_cross_channel_race_is_rejected():
    b = _builder(Collective.ALLGATHER, 2)
    for r in range(2):
        b.copy(r, inp(0), scr(0), channel=1)
        b.copy(r, scr(0), out(r), channel=1)
        b.send(r, 1 - r, inp(0), channel=0)
        b.recv(r, 1 - r, scr(0), channel=0)
        b.copy(r, scr(0), out(1 - r), channel=0)
    with pytest.raises(VerificationError, match="data race") as err:
        verify(b.build())
    assert err.value.chunk == ("scratch", 0)


def test_dependency_orders_channels():
    b = _builder(Collective.ALLGATHER, 2)
    for r in range(2):
        c1 = b.copy(r, inp(0), scr(0), channel=1)
        c2 = b.copy(r, scr(0), out(r), channel=1)
        b.send(r, 1 - r, inp(0), channel=0)
        b.recv(r, 1 - r, scr(0), channel=0, deps=[c1, c2])
        b.copy(r, scr(0), out(1 - r), channel=0)
    verify(b.build())


def test_structural_errors_are_program_errors():
    b = _builder(Collective.ALLGATHER, 2)
    b.send(0, 1, out(5))
    with pytest.raises(ProgramError, match="outside its buffer"):
        b.build()
    b = _builder(Collective.ALLGATHER, 2)
    b.send(0, 0, out(0))
    with pytest.raises(ProgramError, match="peer is the participant itself"):
        b.build()
    b = _builder(Collective.ALLGATHER, 2)
    b.send(0, 7, out(0))
    with pytest.raises(ProgramError, match="peer out of range"):
        b.build()
    b = _builder(Collective.ALLGATHER, 2)
    other = b.copy(1, inp(0), out(1))
    b.copy(0, inp(0), out(0), deps=[other])
    with pytest.raises(ProgramError, match="another participant"):
        b.build()
    with pytest.raises(ProgramError, match="counts differ"):
        _builder().copy(0, inp(0, 1), scr(0, 2))


def test_switch_participant_reduces_in_network():
    n = 3
    b = ProgramBuilder(Collective.ALLREDUCE, n, chunk_factor=1, name="ina")
    sw = b.add_switch()
    for r in range(n):
        b.send(r, sw, inp(0))
    b.recv(sw, 0, scr(0))
    for r in range(1, n):
        b.recv_reduce(sw, r, scr(0), scr(0))
    for r in range(n):
        b.send(sw, r, scr(0))
        b.recv(r, sw, out(0))
    program = b.build()
    assert program.participants[sw].scratch_chunks == 1
    verify(program)


@pytest.mark.parametrize("through_rank_1", [True, False])
def test_happens_before_through_another_rank_orders_two_channels(through_rank_1):
    """Rank 0 writes its output on channel 0, then (after a round trip through rank 1 that
    channel 1 waits for) overwrites it on channel 1: ordered only by messages across ranks.
    Without the round trip, the two writes race."""
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="relay")
    b.copy(0, inp(0), scr(0), channel=0)
    first = b.copy(0, inp(0), out(0), channel=0)
    if through_rank_1:
        b.send(0, 1, scr(0), channel=0)
        got = b.recv(1, 0, scr(0), channel=0)
        b.send(1, 0, scr(0), channel=1, deps=[got])
        b.recv(0, 1, scr(1), channel=1)
    second = b.copy(0, inp(0), out(0), channel=1)
    b.send(0, 1, out(0), channel=2, deps=[first, second])
    b.recv(1, 0, out(0), channel=2)
    b.copy(1, inp(0), out(1), channel=3)
    b.send(1, 0, out(1), channel=3)
    b.recv(0, 1, out(1), channel=3)
    program = b.build()
    if through_rank_1:
        verify(program)
    else:
        with pytest.raises(VerificationError, match="data race") as err:
            verify(program)
        assert err.value.chunk == ("output", 0) and err.value.rank == 0
