"""The depth-first sweep of programs without contended sends times every step exactly as
the wave-by-wave sweep does (:class:`commflow.sim.dag.Sweep`)."""

from __future__ import annotations

import numpy as np
import pytest

from commflow.algorithms import build
from commflow.collectives import Collective
from commflow.ir import Program, ProgramBuilder, inp, out
from commflow.sim.alphabeta import run_alphabeta
from commflow.sim.dag import StepCosts, StepGraph
from commflow.sim.flow import run_flow
from commflow.sim.paths import Connections, place
from commflow.topology import Topology, ring


def two_way_allgather(n: int) -> Program:
    """Ring allgather on two channels, channel 0 clockwise and channel 1 counter-clockwise,
    each step of channel 1 also waiting on the same step of channel 0 (explicit deps)."""
    b = ProgramBuilder(Collective.ALLGATHER, n, chunk_factor=2, name="two-way-ag")
    for r in range(n):
        b.copy(r, inp(0), out(2 * r))
        b.copy(r, inp(1), out(2 * r + 1))
        cw, ccw = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):
            a = b.send(r, cw, out(2 * ((r - s) % n)))
            b.send(r, ccw, out(2 * ((r + s) % n) + 1), channel=1, deps=(a,))
            a = b.recv(r, ccw, out(2 * ((r - s - 1) % n)))
            b.recv(r, cw, out(2 * ((r + s + 1) % n) + 1), channel=1, deps=(a,))
    return b.build()


CASES = [
    (build("allreduce", "ring", 8, chunks=4), ring(8, bandwidth=10e9, latency=1e-6)),
    (two_way_allgather(6), ring(6, bandwidth=10e9, latency=2e-6)),
]


@pytest.mark.parametrize(("program", "topology"), CASES, ids=lambda c: getattr(c, "name", ""))
@pytest.mark.parametrize("runner", [run_alphabeta, run_flow])
def test_depth_first_times_like_waves(program: Program, topology: Topology, runner) -> None:
    conns = Connections(program, topology, place(program, topology, None))
    finishes = []
    for any_order in (False, True):
        graph = StepGraph(program, conns.contended_sends())
        assert graph.any_order
        graph.any_order = any_order
        costs = StepCosts(graph, conns, program.chunk_bytes(1e6), 20e9, 40e9)
        sweep = runner(graph, conns, costs)
        assert sweep.completed == program.nsteps
        finishes.append(sweep.finish)
    assert finishes[0].min() > 0
    np.testing.assert_array_equal(finishes[0], finishes[1])


def test_a_step_with_many_dependencies() -> None:
    """A step waiting on 200 copies (more predecessors than an int8 indegree holds) starts
    after the last of them, in either sweep order."""
    b = ProgramBuilder(Collective.ALLGATHER, 1, chunk_factor=1, name="many-deps")
    copies = [b.copy(0, inp(0), out(0)) for _ in range(200)]
    b.copy(0, inp(0), out(0), channel=1, deps=copies)
    program = b.build()
    topology = ring(2, bandwidth=10e9, latency=1e-6)
    conns = Connections(program, topology, place(program, topology, None))
    chunk = program.chunk_bytes(1e6)
    for any_order in (False, True):
        graph = StepGraph(program, conns.contended_sends())
        assert graph.indegree.dtype == np.int32
        graph.any_order = any_order
        sweep = run_alphabeta(graph, conns, StepCosts(graph, conns, chunk, None, 1e9))
        assert sweep.finish[-1] == pytest.approx(201 * chunk / 1e9, rel=1e-12)
