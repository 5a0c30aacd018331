"""What :func:`commflow.sim.simulate` returns and rejects: link bytes, bus bandwidth, the
critical path, placement, local costs, errors; properties over random programs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.algorithms import build
from commflow.collectives import Collective
from commflow.errors import SimulationError, VerificationError
from commflow.ir import Op, ProgramBuilder, inp, match_transfers, out, scr
from commflow.sim import MODELS, SimResult, simulate
from commflow.topology import Link, Node, NodeKind, fat_tree, make_topology, ring, switch

BW = 10e9
ALPHA = 1e-6


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_ring_allreduce_moves_2_p_minus_1_over_p_n_per_rank(model, p):
    n = 1e6
    network = ring(p, bandwidth=BW, latency=0.0)
    result = simulate(build("allreduce", "ring", p), network, n, model=model)
    forward = [network.link_index(r, (r + 1) % p) for r in range(p)]
    expected = np.zeros(len(network.links))
    expected[forward] = 2 * (p - 1) / p * n
    if p == 2:  # ring(2) has one duplex link, the ring uses both directions
        expected[network.link_index(1, 0)] = 2 * (p - 1) / p * n
    assert result.link_bytes == pytest.approx(expected)
    # Without latency the ring keeps every forward link busy all the time.
    assert result.link_utilization[forward] == pytest.approx(np.ones(p))
    assert result.algbw == pytest.approx(n / result.time)
    assert result.busbw == pytest.approx(result.algbw * 2 * (p - 1) / p)
    assert (result.model, result.size, result.nranks) == (model, n, p)


def test_link_bytes_on_a_fat_tree_follow_the_routes():
    """Ranks 0 and 2 of fat_tree(4) sit on different edge switches of pod 0: the message goes
    up to both aggregation switches of the pod, half each, and down again."""
    network = fat_tree(4)
    b = ProgramBuilder(Collective.ALLGATHER, 4, chunk_factor=1, name="cross-edge")
    b.transfer(0, 2, inp(0), out(0))
    result = simulate(b.build(), network, 4e6)  # 1e6 bytes
    edge0, edge1 = 16, 17  # hosts 0..15, then edge switches pod by pod
    agg0, agg1 = 24, 25
    expected = {
        (0, edge0): 1e6,
        (edge0, agg0): 5e5,
        (edge0, agg1): 5e5,
        (agg0, edge1): 5e5,
        (agg1, edge1): 5e5,
        (edge1, 2): 1e6,
    }
    for (u, v), nbytes in expected.items():
        assert result.link_bytes[network.link_index(u, v)] == pytest.approx(nbytes)
    assert result.link_bytes.sum() == pytest.approx(4e6)


@pytest.mark.parametrize("model", MODELS)
def test_critical_path_runs_from_a_source_to_the_last_step(model):
    p = 4
    program = build("allreduce", "ring", p)
    result = simulate(program, ring(p, bandwidth=BW, latency=ALPHA), 1e6, model=model)
    path = result.critical_path
    # Each of the 2(p-1) ring steps contributes its send and the receive it feeds.
    assert len(path) == 4 * (p - 1)
    assert result.finish[path[-1]] == result.time
    t = program.table
    assert program.where(path[0])[2] == 0 and t.op[path[0]] == Op.SEND
    sender = match_transfers(program)
    for before, after in zip(path, path[1:], strict=False):
        assert before == after - 1 or sender[after] == before
        assert result.finish[before] <= result.finish[after]
    rows = result.describe_critical_path(program)
    assert [(r.participant, r.channel, r.position) for r in rows] == [
        program.where(i) for i in path
    ]
    assert rows[-1].finish == result.time
    assert rows[0].op is Op.SEND and rows[0].peer == (rows[0].participant + 1) % p
    assert "SEND to" in rows[0].describe()


def test_describe_critical_path_needs_the_simulated_program():
    result = simulate(build("allgather", "ring", 3), ring(3), 1e6)
    with pytest.raises(SimulationError, match="steps"):
        result.describe_critical_path(build("allgather", "ring", 4))


@pytest.mark.parametrize("model", MODELS)
def test_a_program_without_steps_takes_no_time(model):
    program = ProgramBuilder(Collective.ALLGATHER, 1, chunk_factor=1, name="empty").build()
    result = simulate(program, ring(1), 1e6, model=model)
    assert result.time == 0.0 and result.algbw == float("inf")
    assert result.critical_path == () and len(result.finish) == 0
    assert not result.link_bytes.any() and not result.link_utilization.any()


@pytest.mark.parametrize("model", MODELS)
def test_size_zero_costs_latency_only(model):
    p = 5
    result = simulate(build("allgather", "ring", p), ring(p, latency=ALPHA), 0, model=model)
    assert result.time == pytest.approx((p - 1) * ALPHA)
    assert result.algbw == 0.0


@pytest.mark.parametrize("model", MODELS)
def test_local_steps_cost_bytes_over_their_bandwidth(model):
    """Rank 0: copy (2 chunks), reduce (1 chunk), then send 1 chunk to rank 1, which
    receive-reduces it. Chunk = 1e6 bytes."""
    b = ProgramBuilder(Collective.ALLREDUCE, 2, chunk_factor=2, name="local")
    b.copy(0, inp(0, 2), scr(0, 2))
    b.reduce(0, scr(0), out(0))
    b.send(0, 1, out(0))
    b.recv_reduce(1, 0, inp(0), out(0))
    program = b.build()
    copy_bw, reduce_bw = 2e9, 4e9
    result = simulate(
        program,
        ring(2, bandwidth=BW, latency=ALPHA),
        2e6,
        model=model,
        copy_bandwidth=copy_bw,
        reduce_bandwidth=reduce_bw,
    )
    expected = 2e6 / copy_bw + 1e6 / reduce_bw + 1e6 / BW + ALPHA + 1e6 / reduce_bw
    assert result.time == pytest.approx(expected)
    free = simulate(program, ring(2, bandwidth=BW, latency=ALPHA), 2e6, model=model)
    assert free.time == pytest.approx(1e6 / BW + ALPHA)


@pytest.mark.parametrize("model", MODELS)
def test_dependencies_across_channels_order_steps(model):
    """Rank 0 copies on channel 0 (1 s) and, on channel 1, sends once the copy is done; the
    critical path runs copy -> send -> receive."""
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="deps")
    copy = b.copy(0, inp(0), out(0), channel=0)
    send = b.send(0, 1, inp(0), channel=1, deps=[copy])
    recv = b.recv(1, 0, out(0), channel=1)
    program = b.build()
    result = simulate(
        program, ring(2, bandwidth=BW, latency=ALPHA), 2e10, model=model, copy_bandwidth=BW
    )
    steps = [program.step_range(s.participant, s.channel)[s.position] for s in (copy, send, recv)]
    assert result.finish[steps] == pytest.approx([1.0, 2.0, 2.0 + ALPHA])
    assert result.critical_path == tuple(steps)
    rows = result.describe_critical_path(program)
    assert [r.describe() for r in rows] == [
        "participant 0 channel 0 step 0: COPY, done at 1000000.000 us",
        "participant 0 channel 1 step 0: SEND to 1, done at 2000000.000 us",
        "participant 1 channel 1 step 0: RECV from 0, done at 2000001.000 us",
    ]


@pytest.mark.parametrize("model", MODELS)
def test_placement_moves_ranks_onto_nodes(model):
    """The ring allreduce placed in reverse on a ring topology uses the backward links."""
    p, n = 4, 1e6
    network = ring(p, bandwidth=BW, latency=ALPHA)
    program = build("allreduce", "ring", p)
    straight = simulate(program, network, n, model=model)
    reverse = simulate(program, network, n, model=model, placement=[3, 2, 1, 0])
    assert reverse.time == pytest.approx(straight.time)
    backward = [network.link_index(r, (r - 1) % p) for r in range(p)]
    assert reverse.link_bytes[backward] == pytest.approx([2 * (p - 1) / p * n] * p)
    assert reverse.link_bytes.sum() == pytest.approx(straight.link_bytes.sum())


def test_participants_on_one_node_transfer_for_free():
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="local")
    b.transfer(0, 1, inp(0), out(0))
    result = simulate(b.build(), switch(2, latency=ALPHA), 2e9, placement=[0, 0])
    assert result.time == 0.0 and not result.link_bytes.any()


def test_in_network_participant_goes_on_a_switch():
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="ina")
    sw = b.add_switch()
    b.transfer(0, sw, inp(0), scr(0))
    b.transfer(sw, 1, scr(0), out(0))
    program = b.build()
    network = switch(2, bandwidth=BW, latency=ALPHA)
    result = simulate(program, network, 2e9, placement=[0, 1, 2])
    assert result.time == pytest.approx(2 * (1e9 / BW + ALPHA))
    with pytest.raises(SimulationError, match="in-network participant; pass placement"):
        simulate(program, network, 2e9)
    with pytest.raises(SimulationError, match="rank node"):
        simulate(program, network, 2e9, placement=[0, 1, 1])


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        ([0, 1, 2], "3 entries but .* 4 participants"),
        ([0, 1, 2, 9], "node 9, but topology"),
        ([0, 1, 2, -1], "node -1"),
        ([0, 1, 2, 4], "rank 3 on switch node 4"),
        ([0, 1, 2, "3"], "not a node id"),
    ],
)
def test_bad_placements_are_named(placement, message):
    with pytest.raises(SimulationError, match=message):
        simulate(build("allgather", "ring", 4), switch(4), 1e6, placement=placement)


def test_program_larger_than_topology_needs_a_placement():
    with pytest.raises(SimulationError, match="needs 5 ranks but topology ring4 has 4"):
        simulate(build("allgather", "ring", 5), ring(4), 1e6)


def test_unreachable_peer_is_a_simulation_error():
    nodes = [Node(i, NodeKind.RANK, f"r{i}") for i in range(2)]
    one_way = make_topology("one-way", nodes, [Link(0, 1, BW, 0.0)])
    with pytest.raises(SimulationError, match="participant 1 .* sends to participant 0"):
        simulate(build("allgather", "ring", 2), one_way, 1e6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "packet"}, "unknown model 'packet'; use one of alphabeta, flow"),
        ({"size": -1}, "size must be a finite number of bytes >= 0"),
        ({"size": float("nan")}, "size must be"),
        ({"reduce_bandwidth": 0}, "reduce_bandwidth must be a positive number"),
        ({"copy_bandwidth": float("inf")}, "copy_bandwidth must be a positive number"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    args = {"size": 1e6, **kwargs}
    with pytest.raises(SimulationError, match=message):
        simulate(build("allgather", "ring", 2), ring(2), **args)


@pytest.mark.parametrize("model", MODELS)
def test_a_deadlock_is_reported(model):
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="stuck")
    for r in (0, 1):
        b.recv(r, 1 - r, out(1 - r))
        b.send(r, 1 - r, inp(0))
    with pytest.raises(
        SimulationError, match=r"4 step\(s\) never start \(deadlock\), the first at participant 0"
    ):
        simulate(b.build(), ring(2), 1e6, model=model)


def test_unmatched_sends_fail_verification():
    b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="lonely")
    b.send(0, 1, inp(0))
    with pytest.raises(VerificationError, match="mismatched send/recv"):
        simulate(b.build(), ring(2), 1e6)


def test_result_is_immutable():
    result = simulate(build("allgather", "ring", 3), ring(3), 1e6)
    assert isinstance(result, SimResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.time = 0.0
    for array in (result.finish, result.link_bytes, result.link_utilization):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1.0


@st.composite
def random_programs(draw):
    """Random deadlock-free programs on ``p`` ranks: transfers in a global order, each a send
    on the sender's channel and a receive on the receiver's same channel, with copies mixed
    in. Every wait points to an earlier transfer, so nothing deadlocks."""
    p = draw(st.integers(2, 6))
    b = ProgramBuilder(Collective.ALLGATHER, p, chunk_factor=1, name="random")
    for _ in range(draw(st.integers(1, 12))):
        src, dst = draw(st.lists(st.integers(0, p - 1), min_size=2, max_size=2, unique=True))
        channel = draw(st.integers(0, 1))
        if draw(st.booleans()):
            b.copy(src, inp(0), out(src), channel=channel)
        b.transfer(src, dst, inp(0), out(src), channel=channel)
    return b.build()


@settings(max_examples=40, deadline=None)
@given(program=random_programs(), model=st.sampled_from(MODELS))
def test_time_scales_with_size_without_latency(program, model):
    network = switch(program.nranks, bandwidth=BW, latency=0.0)
    small = simulate(program, network, 1e6, model=model, copy_bandwidth=BW)
    large = simulate(program, network, 3e6, model=model, copy_bandwidth=BW)
    assert large.time == pytest.approx(3 * small.time)
    assert large.finish == pytest.approx(3 * small.finish)


@settings(max_examples=40, deadline=None)
@given(program=random_programs())
def test_flow_never_overloads_a_link_and_keeps_channel_order(program):
    network = switch(program.nranks, bandwidth=BW, latency=ALPHA)
    result = simulate(program, network, 1e6, model="flow")
    assert (result.link_utilization <= 1 + 1e-9).all()
    t = program.table
    later = t.position > 0
    assert (result.finish[1:][later[1:]] >= result.finish[:-1][later[1:]]).all()
    # No message beats its own transfer time: one chunk at full bandwidth over two hops.
    assert result.time >= program.chunk_bytes(1e6) / BW + 2 * ALPHA - 1e-12
