"""Targets: bounded connection buffers as dependencies (verify and simulate honour them), the
runtimes' rules, and MSCCL's loops over a large buffer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import commflow.algorithms as algorithms
from commflow import topology
from commflow.collectives import Collective
from commflow.errors import ProgramError, SimulationError, VerificationError
from commflow.ir import ProgramBuilder, inp, out, verify
from commflow.ir.target import TARGETS, Target, bounded, get_target
from commflow.ir.transform import repeat
from commflow.sim import simulate


def exchange(nranks: int, chunks: int, count: int = 1):
    """Every rank sends ``chunks`` messages of ``count`` chunks to the next rank, then receives
    them from the previous one: an allgather that hangs once the messages overflow a buffer."""
    cf = chunks * count
    b = ProgramBuilder(Collective.ALLGATHER, nranks, chunk_factor=cf, name=f"burst{chunks}")
    for r in range(nranks):
        b.copy(r, inp(0, cf), out(r * cf, cf))
    for hop in range(nranks - 1):
        for r in range(nranks):
            src = (r - hop) % nranks
            for k in range(chunks):
                b.send(r, (r + 1) % nranks, out(src * cf + k * count, count))
            for k in range(chunks):
                b.recv(r, (r - 1) % nranks, out(((src - 1) % nranks) * cf + k * count, count))
    return b.build()


@pytest.mark.parametrize(("protocol", "in_flight"), [("Simple", 2), ("LL", 8), ("LL128", 8)])
def test_messages_in_flight_per_protocol(protocol, in_flight):
    target = get_target("msccl", protocol=protocol)
    verify(exchange(3, in_flight), target=target)
    with pytest.raises(VerificationError, match=f"deadlock on msccl .{protocol}"):
        verify(exchange(3, in_flight + 1), target=target)
    verify(exchange(3, in_flight + 1))  # the live runtime buffers without bound


def test_a_message_larger_than_the_buffer_is_a_rendezvous():
    """3 chunks = 12 Simple slots > 8: the send completes only once the receiver is there, so
    one such message before the receive hangs; with LL (3 slots) it is buffered."""
    with pytest.raises(VerificationError, match="deadlock on rccl"):
        verify(exchange(2, 1, count=3), target="rccl")
    verify(exchange(2, 1, count=3), target=get_target("rccl", protocol="LL"))


def test_bounded_adds_the_closed_form_waits():
    """Send k waits for the receive of message k - 2 (two Simple chunks in flight)."""
    program = exchange(2, 5)
    extra = bounded(program, get_target("msccl"))
    t, e = program.table, extra.table
    sends = np.flatnonzero((t.op == 0) & (t.part == 0))
    for k, send in enumerate(sends):
        added = set(e.deps_of(int(send)).tolist()) - set(t.deps_of(int(send)).tolist())
        if k < 2:
            assert not added
        else:
            (recv,) = added
            assert program.where(recv) == (1, 0, 1 + 5 + (k - 2))  # rank 1's (k-2)-th receive
    assert bounded(program, get_target("live")) is program


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["ring", "double_binary_tree", "recursive_doubling", "direct"]),
       st.integers(2, 6), st.integers(1, 4))
def test_bounded_only_delays(algo, nranks, chunks):
    """Whatever verifies on a bounded target verifies live; its simulated time is never
    shorter than live."""
    try:
        program = algorithms.build("allgather", algo, nranks, chunks=chunks)
    except Exception:
        return
    topo = topology.ring(nranks, bandwidth=10e9, latency=1e-6)
    live = simulate(program, topo, 1 << 20).time
    try:
        verify(program, target="msccl")
    except VerificationError:
        with pytest.raises(SimulationError, match="deadlock"):
            simulate(program, topo, 1 << 20, target=Target(name="x", slots=8, slots_per_chunk=4))
        return
    verify(program)
    assert simulate(program, topo, 1 << 20, target="msccl").time >= live * (1 - 1e-12)


def test_repeat_runs_every_channel_in_loops_with_the_same_time_per_byte():
    program = algorithms.build("allreduce", "ring", 4)
    looped = repeat(program, 3)
    assert looped.nsteps == 3 * program.nsteps
    assert looped.chunk_factor == 3 * program.chunk_factor
    assert looped.participants[0].input_chunks == 3 * program.participants[0].input_chunks
    topo = topology.ring(4, bandwidth=10e9, latency=1e-6)
    # each loop runs the ring's 6 hops on a third of the bytes: 2 loops more of latency
    one, three = simulate(program, topo, 3e6).time, simulate(looped, topo, 3e6).time
    assert three == pytest.approx(one + 2 * 6 * 1e-6, rel=1e-9)
    assert repeat(program, 1) is program
    with pytest.raises(ProgramError, match="loops must be >= 1"):
        repeat(program, 0)


def test_simulate_on_a_target_loops_over_chunks_of_its_size():
    """Simple carries 2 MiB per chunk per loop: 64 MiB over 4 ranks (16 MiB chunks) is 8
    loops, each paying the ring's 3 hop latencies again."""
    program = algorithms.build("allgather", "ring", 4)
    topo = topology.ring(4, bandwidth=10e9, latency=1e-6)
    size = 64 << 20
    live = simulate(program, topo, size).time
    target = simulate(program, topo, size, target="msccl").time
    loops = math.ceil(size / 4 / (2 << 20))
    assert loops == 8
    assert target == pytest.approx(live + (loops - 1) * 3 * 1e-6, rel=1e-9)
    assert simulate(program, topo, size, target=get_target("msccl", protocol="LL")).time > target


def test_targets_and_their_rules():
    assert TARGETS == ("live", "msccl", "msccl-executor", "rccl")
    msccl, rccl = get_target("msccl"), get_target("rccl")
    assert (msccl.max_steps_per_threadblock, rccl.max_steps_per_threadblock) == (256, 64)
    assert msccl.collective_names[Collective.REDUCESCATTER] == "reduce_scatter"
    assert rccl.collective_names[Collective.REDUCESCATTER] == "reducescatter"
    assert Collective.GATHER not in msccl.collective_names
    assert not get_target().bounded and get_target("live").describe().startswith("live")
    with pytest.raises(ProgramError, match="unknown target 'nccl'"):
        get_target("nccl")
    with pytest.raises(ProgramError, match="unknown protocol"):
        get_target("msccl", protocol="ll")
