"""``--show``'s picture: the links drawn are exactly the links the program loads."""

import math

import pytest

from commflow import topology
from commflow.errors import CommflowError
from commflow.ir import Op
from commflow.sim import lower_bound, simulate
from commflow.synth import schedule_picture, synthesize

SIZE = 1 << 30


@pytest.fixture(scope="module")
def dgx1_allgather():
    topo = topology.dgx1()
    program = synthesize("allgather", topo, pieces=4)
    return topo, program, simulate(program, topo, SIZE, model="alphabeta")


def test_drawn_links_are_the_links_the_sends_use(dgx1_allgather):
    topo, program, result = dgx1_allgather
    picture = schedule_picture(program, topo, result)
    t = program.table
    sends = t.op == Op.SEND
    pairs = set(zip(t.part[sends].tolist(), t.peer[sends].tolist(), strict=True))
    assert all(topo.link(u, v) is not None for u, v in pairs)  # trees use NVLinks only
    assert set(picture.loads) == pairs
    every = {(link.src, link.dst) for link in topo.links}
    assert set(picture.unused) == every - pairs
    # each of the 8 shards (size/8) reaches the 7 other ranks over one link each
    assert sum(picture.loads.values()) == pytest.approx(7.0, rel=1e-12)


def test_busiest_link_sets_the_bound(dgx1_allgather):
    topo, program, result = dgx1_allgather
    picture = schedule_picture(program, topo, result)
    seconds = {k: load / topo.link(*k).bandwidth for k, load in picture.loads.items()}
    busiest = max(seconds.values())
    bound = lower_bound("allgather", topo, SIZE).time / SIZE
    assert bound * (1 - 1e-9) <= busiest <= bound * 1.005  # an optimal packing
    assert picture.busy == pytest.approx({k: s / busiest for k, s in seconds.items()})
    pct = 100 * lower_bound("allgather", topo, SIZE).time / result.time
    assert f"{pct:.1f}% of the lower bound at 1G (alphabeta model)" in picture.title
    assert picture.title.startswith("allgather on dgx1: allgather/synth_trees")


def test_ranks_on_a_circle_switch_in_the_middle():
    topo = topology.load("dgx-a100")
    program = synthesize("allgather", topo, pieces=1)
    picture = schedule_picture(program, topo, simulate(program, topo, 1 << 20))
    assert picture.ranks == frozenset(range(8))
    assert all(math.hypot(*picture.positions[r]) == pytest.approx(1.0) for r in range(8))
    assert picture.positions[8] == pytest.approx((0.0, 0.0))
    assert picture.names[8] == topo.nodes[8].name
    assert all(u == 8 or v == 8 for u, v in picture.loads)


def test_result_of_another_topology_is_refused(dgx1_allgather):
    _, program, result = dgx1_allgather
    with pytest.raises(CommflowError, match="does not match"):
        schedule_picture(program, topology.load("dgx-a100"), result)
