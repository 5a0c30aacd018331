"""build_for: algorithms instantiated for a topology."""

from __future__ import annotations

from commflow.algorithms import build, build_for
from commflow.ir import verify
from commflow.sim import simulate
from commflow.topology import dgx1, dgx_a100, ring_order


def test_ring_on_dgx1_follows_nvlinks_and_doubles_busbw():
    topology = dgx1()
    program = build_for("allreduce", "ring", topology)
    verify(program)
    assert dict(program.params)["order"] == ring_order(topology)
    naive = simulate(build("allreduce", "ring", 8), topology, 1 << 30)
    aware = simulate(program, topology, 1 << 30)
    assert aware.busbw > 1.9 * naive.busbw


def test_hierarchical_takes_the_box_size():
    program = build_for("allreduce", "hierarchical", dgx_a100(2))
    assert dict(program.params)["box"] == 8
    verify(program)


def test_explicit_parameters_win():
    program = build_for("allreduce", "hierarchical", dgx_a100(2), box=4)
    assert dict(program.params)["box"] == 4
