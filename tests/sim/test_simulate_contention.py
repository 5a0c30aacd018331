"""Link sharing, computed by hand: contention in both models, max-min fairness in the flow
model, ECMP packet spraying."""

from __future__ import annotations

import pytest

from commflow.collectives import Collective
from commflow.ir import Program, ProgramBuilder, StepId, inp, out
from commflow.sim import MODELS, simulate
from commflow.topology import Link, Node, NodeKind, make_topology, switch

BW = 1e9


def index(program: Program, step: StepId) -> int:
    """Global index of a builder's step in the built program."""
    return program.step_range(step.participant, step.channel)[step.position]


def builder(nranks: int, chunk_factor: int = 1) -> ProgramBuilder:
    return ProgramBuilder(Collective.ALLGATHER, nranks, chunk_factor=chunk_factor, name="test")


def into_rank2(senders: tuple[int, ...]) -> tuple[Program, list[int]]:
    """Each of ``senders`` sends its block to rank 2 (on its own channel 0)."""
    b = builder(3)
    sends = [b.transfer(r, 2, inp(0), out(r))[0] for r in senders]
    program = b.build()
    return program, [index(program, s) for s in sends]


@pytest.mark.parametrize("model", MODELS)
def test_two_transfers_sharing_a_link_take_twice_as_long(model):
    latency, size = 1e-6, 3e9  # chunk = size / 3 = 1e9 bytes, 1 s alone at BW
    network = switch(3, bandwidth=BW, latency=latency)
    alone, (s0,) = into_rank2((0,))
    shared, (t0, t1) = into_rank2((0, 1))
    one = simulate(alone, network, size, model=model)
    two = simulate(shared, network, size, model=model)
    assert one.finish[s0] == pytest.approx(1.0)
    assert two.finish[t0] == pytest.approx(2.0) and two.finish[t1] == pytest.approx(2.0)
    assert one.time == pytest.approx(1.0 + 2 * latency)
    assert two.time == pytest.approx(2.0 + 2 * latency)
    down = network.link_index(3, 2)
    assert two.link_bytes[down] == pytest.approx(2e9)
    assert two.link_utilization[down] == pytest.approx(2e9 / (BW * two.time))


@pytest.mark.parametrize("model", MODELS)
def test_transfers_on_disjoint_links_do_not_slow_each_other(model):
    b = builder(4)
    a = b.transfer(0, 1, inp(0), out(0))[0]
    c = b.transfer(2, 3, inp(0), out(2))[0]
    program = b.build()
    result = simulate(program, switch(4, bandwidth=BW, latency=0.0), 4e9, model=model)
    assert result.finish[index(program, a)] == pytest.approx(1.0)
    assert result.finish[index(program, c)] == pytest.approx(1.0)


def three_flows_on_two_links(latency: float):
    """Line 0 -> 1 -> 2 with links A = 0->1 at BW and B = 1->2 at 2 BW. Flows: f1 0->2 (2e9
    bytes, over A and B), f2 0->1 (1e9 bytes, A), f3 1->2 (2e9 bytes, B); rank 0 sends f1 and
    f2 on two channels, so all three start at 0."""
    nodes = [Node(i, NodeKind.RANK, f"r{i}") for i in range(3)]
    network = make_topology("line", nodes, [Link(0, 1, BW, latency), Link(1, 2, 2 * BW, latency)])
    b = builder(3, chunk_factor=2)  # size 6e9 -> 1e9 bytes per chunk
    f1 = b.transfer(0, 2, inp(0, 2), out(0, 2), channel=0)[0]
    f2 = b.transfer(0, 1, inp(0), out(0), channel=1)[0]
    f3 = b.transfer(1, 2, inp(0, 2), out(2, 2), channel=0)[0]
    program = b.build()
    return program, network, [index(program, f) for f in (f1, f2, f3)]


def test_max_min_fairness_three_flows_two_links():
    """By hand: A is shared by f1, f2 (0.5 BW each); f1 takes 0.5 BW of B, leaving 1.5 BW to
    f3. f3 ends at 2e9 / 1.5e9 = 4/3 s; f2 at 1e9 / 0.5e9 = 2 s; then f1 (1e9 bytes left)
    runs alone at BW: 3 s. Messages arrive one path latency later."""
    latency = 1e-3
    program, network, (f1, f2, f3) = three_flows_on_two_links(latency)
    result = simulate(program, network, 6e9, model="flow")
    assert result.finish[[f1, f2, f3]] == pytest.approx([3.0, 2.0, 4 / 3])
    assert result.time == pytest.approx(3.0 + 2 * latency)
    assert result.link_bytes == pytest.approx([3e9, 4e9])
    assert result.link_utilization.max() <= 1.0


def test_alphabeta_counts_each_link_load_in_the_wave():
    """Same flows, one wave: A carries f1, f2 (load 2), B carries f1, f3 (load 2). f1 takes
    2e9 * max(2/BW, 2/(2 BW)) = 4 s; f2 1e9 * 2/BW = 2 s; f3 2e9 * 2/(2 BW) = 2 s."""
    program, network, (f1, f2, f3) = three_flows_on_two_links(0.0)
    result = simulate(program, network, 6e9, model="alphabeta")
    assert result.finish[[f1, f2, f3]] == pytest.approx([4.0, 2.0, 2.0])


def late_joiner():
    """Ranks 0 and 1 send 1e9 bytes each to rank 2 through a switch; rank 1 first copies a
    chunk (0.5 s at copy bandwidth 2 BW), so its send starts in the next wave."""
    b = builder(3)
    first = b.transfer(0, 2, inp(0), out(0))[0]
    b.copy(1, inp(0), out(1))
    second = b.transfer(1, 2, inp(0), out(1))[0]
    program = b.build()
    return program, index(program, first), index(program, second)


def test_flow_rates_change_when_a_flow_joins():
    """f0 runs alone at BW for 0.5 s (0.5e9 left), then both share: f0 ends at 0.5 + 1 = 1.5 s
    with f1 half done; f1 then runs alone: 2 s."""
    program, first, second = late_joiner()
    result = simulate(
        program, switch(3, bandwidth=BW, latency=0.0), 3e9, model="flow", copy_bandwidth=2 * BW
    )
    assert result.finish[[first, second]] == pytest.approx([1.5, 2.0])


def test_alphabeta_does_not_count_sends_of_different_waves():
    """The copy puts rank 1's send in wave 1; with free copies both sends start at 0, and the
    alpha-beta model lets each run at full bandwidth (the flow model shares: 2 s each)."""
    program, first, second = late_joiner()
    network = switch(3, bandwidth=BW, latency=0.0)
    alphabeta = simulate(program, network, 3e9, model="alphabeta")
    flow = simulate(program, network, 3e9, model="flow")
    assert alphabeta.finish[[first, second]] == pytest.approx([1.0, 1.0])
    assert flow.finish[[first, second]] == pytest.approx([2.0, 2.0])


@pytest.mark.parametrize("model", MODELS)
def test_ecmp_sprays_a_message_over_equal_cost_paths(model):
    """Rank 0 reaches rank 1 through switch 2 or switch 3: half the bytes take each path, so
    the message moves at twice the link bandwidth."""
    latency = 1e-6
    nodes = [
        Node(0, NodeKind.RANK, "r0"),
        Node(1, NodeKind.RANK, "r1"),
        Node(2, NodeKind.SWITCH, "s0"),
        Node(3, NodeKind.SWITCH, "s1"),
    ]
    links = [
        Link(0, 2, BW, latency),
        Link(2, 1, BW, latency),
        Link(0, 3, BW, latency),
        Link(3, 1, BW, latency),
    ]
    network = make_topology("two-paths", nodes, links)
    b = builder(2)
    send = b.transfer(0, 1, inp(0), out(0))[0]
    program = b.build()
    result = simulate(program, network, 2e9, model=model)  # 1e9 bytes
    assert result.finish[index(program, send)] == pytest.approx(0.5)
    assert result.time == pytest.approx(0.5 + 2 * latency)
    assert result.link_bytes == pytest.approx([5e8] * 4)


@pytest.mark.parametrize("model", MODELS)
def test_contended_link_used_in_turn_costs_no_sharing(model):
    """Ranks 0 and 1 both send to rank 2 over the switch link sw->2 (a contended connection
    pair, so the flow model runs its event loop), but in turn: 0 -> 2, 2 -> 1, then 1 -> 2.
    Three messages of 1 s each, two hops of latency each: 3 s + 6 latencies."""
    latency = 1e-3
    b = builder(3)
    b.transfer(0, 2, inp(0), out(0))
    b.transfer(2, 1, inp(0), out(2))
    b.transfer(1, 2, inp(0), out(1))
    result = simulate(b.build(), switch(3, bandwidth=BW, latency=latency), 3e9, model=model)
    assert result.time == pytest.approx(3.0 + 6 * latency)
    assert len(result.critical_path) == 6
