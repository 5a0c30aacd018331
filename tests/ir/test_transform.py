"""relabel: a program laid out on another rank order still implements its collective."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.algorithms import build
from commflow.collectives import Collective
from commflow.errors import ProgramError
from commflow.ir import relabel, verify
from commflow.ir.build import ProgramBuilder
from commflow.ir.msccl import fused_sends
from commflow.ir.step import Buffer, Op, Ref
from commflow.ir.transform import repeat, repeated, split_messages, stack

CASES = [("allreduce", "ring"), ("allgather", "ring"), ("reducescatter", "ring"),
         ("broadcast", "ring"), ("alltoall", "pairwise"), ("gather", "direct"),
         ("scatter", "binomial_tree"), ("allreduce", "double_binary_tree")]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CASES), st.integers(2, 9), st.randoms(use_true_random=False))
def test_relabelled_programs_verify(case, n, rnd):
    collective, name = case
    order = list(range(n))
    rnd.shuffle(order)
    program = build(collective, name, n, chunks=2)
    moved = relabel(program, order)
    verify(moved)
    assert moved.nsteps == program.nsteps
    assert dict(moved.params)["order"] == tuple(order)
    # rank order[i] does what rank i did
    for i in range(n):
        mine = program.steps(i, 0)
        theirs = moved.steps(order[i], 0)
        assert [s.op for s in mine] == [s.op for s in theirs]
        assert [None if s.peer is None else order[s.peer] for s in mine] == \
            [s.peer for s in theirs]


def test_relabel_maps_the_root():
    program = build("broadcast", "binomial_tree", 4, root=0)
    assert relabel(program, [2, 0, 3, 1]).root == 2


def test_relabel_rejects_bad_orders():
    program = build("allreduce", "ring", 4)
    with pytest.raises(ProgramError, match="permutation"):
        relabel(program, [0, 1, 1, 2])
    with pytest.raises(ProgramError, match="does not keep contiguous"):
        relabel(build("alltoall", "bruck", 5), [4, 3, 2, 1, 0])


def test_identity_relabel_keeps_every_column():
    program = build("allgather", "recursive_doubling", 8)
    same = relabel(program, range(8))
    for column in ("part", "peer", "src_off", "dst_off", "op", "count"):
        assert np.array_equal(getattr(program.table, column), getattr(same.table, column))


ONE_BLOCK_PER_STEP = [case for case in CASES if case != ("scatter", "binomial_tree")]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(ONE_BLOCK_PER_STEP), st.integers(2, 7), st.integers(1, 3),
       st.randoms(use_true_random=False))
def test_stacked_programs_verify_on_shares_of_the_data(case, n, k, rnd):
    """k copies of an algorithm, each laid out on its own order, side by side."""
    collective, name = case
    base = build(collective, name, n, chunks=1)
    copies = []
    for _ in range(k):
        order = list(range(n))
        if collective in ("allreduce", "allgather", "reducescatter"):
            rnd.shuffle(order)
        copies.append(relabel(base, order))
    stacked = stack(copies)
    verify(stacked)
    assert stacked.chunk_factor == k * base.chunk_factor
    assert stacked.nsteps == k * base.nsteps
    assert len({c for chans in stacked.channels for c in chans}) >= k
    assert dict(stacked.params)["stacked"] == k


def test_stack_refuses_mismatched_programs():
    with pytest.raises(ProgramError, match="differs"):
        stack([build("allreduce", "ring", 4), build("allreduce", "ring", 5)])
    with pytest.raises(ProgramError, match="at least one"):
        stack([])
    halves = build("scatter", "binomial_tree", 4)  # sends half the blocks at once
    with pytest.raises(ProgramError, match="moves chunks of several blocks"):
        stack([halves, halves])


@pytest.mark.parametrize("loops", [1, 2, 5])
def test_repeated_finds_every_loops_copy_of_a_step(loops):
    program = build("allreduce", "ring", 4, chunks=2)
    t, looped = program.table, repeat(program, loops).table
    for step in (0, 3, len(t) - 1):
        copies = repeated(program, loops, [step])
        for column in ("part", "chan", "op", "peer", "count"):
            assert (getattr(looped, column)[copies] == getattr(t, column)[step]).all()
        length = len(program.step_range(int(t.part[step]), int(t.chan[step])))
        assert (looped.position[copies] == t.position[step] + length * np.arange(loops)).all()


def test_split_messages_cuts_steps_and_alternates_fused_parts():
    """A 2D-torus allreduce on 8 ranks (steps of 1-2 chunks, fused forwards of 2) cut into
    single chunks: a channel still moves the same chunks; a fused send's parts follow their
    receive's one by one; the parts still verify."""
    program, most = build("allreduce", "torus2d", 8), 1
    t = program.table
    fused = fused_sends(program, "msccl")
    assert len(fused) and t.count[fused].max() > most
    cut, parts_fused = split_messages(program, most, fused)
    c = cut.table
    assert len(c) == int((-(-t.count // most)).sum())
    assert c.count.max() <= most
    assert np.array_equal(np.bincount(c.part * 64 + c.chan, weights=c.count),
                          np.bincount(t.part * 64 + t.chan, weights=t.count))
    assert len(parts_fused) == int((-(-t.count[fused] // most)).sum())
    assert (c.op[parts_fused] == Op.SEND).all()
    assert np.isin(c.op[parts_fused - 1], (Op.RECV, Op.RECV_REDUCE)).all()
    assert (c.dst_off[parts_fused - 1] == c.src_off[parts_fused]).all()
    assert (c.count[parts_fused - 1] == c.count[parts_fused]).all()
    verify(cut)  # raises VerificationError on a broken program
    assert split_messages(program, 2, fused)[0] is program


def test_split_messages_moves_dependencies_to_first_and_last_parts():
    b = ProgramBuilder(Collective.BROADCAST, 2, chunk_factor=2, name="waits")
    sent = b.send(0, 1, Ref(Buffer.INPUT, 0, 2))
    b.copy(0, Ref(Buffer.INPUT, 0, 2), Ref(Buffer.OUTPUT, 0, 2), channel=1, deps=[sent])
    b.recv(1, 0, Ref(Buffer.OUTPUT, 0, 2))
    cut, fused = split_messages(b.build(), 1)
    c = cut.table
    assert fused is None
    assert c.op.tolist() == [Op.SEND] * 2 + [Op.COPY] * 2 + [Op.RECV] * 2
    assert c.src_off[:4].tolist() == [0, 1, 0, 1] and c.dst_off[2:].tolist() == [0, 1] * 2
    assert np.diff(c.dep_ptr).tolist() == [0, 0, 1, 0, 0, 0] and c.dep_idx.tolist() == [1]
    verify(cut)  # raises VerificationError on a broken program
    with pytest.raises(ProgramError, match="most must be >= 1"):
        split_messages(cut, 0)


@pytest.mark.parametrize("nranks", [4, 8])
def test_every_registered_program_cut_into_single_chunks_still_verifies(nranks):
    """Bruck, recursive doubling, halving-doubling, trees, ... (steps of up to ``n`` chunks):
    cut into single-chunk messages, fused forwards alternating, each still computes its
    collective and moves the same chunks on every channel."""
    from .test_msccl import registered

    cut_any = False
    for program in registered(nranks, chunks=2):
        t = program.table
        fused = fused_sends(program, "msccl")
        cut, parts = split_messages(program, 1, fused)
        c = cut.table
        assert len(c) == int(t.count.sum()) and (c.count == 1).all()
        assert len(parts) == int(t.count[fused].sum())
        verify(cut)
        cut_any |= len(c) > len(t)
    assert cut_any
