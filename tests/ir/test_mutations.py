"""Property tests: generated programs verify; random mutations of them are rejected."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import commflow.algorithms as algorithms
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import Program, verify
from commflow.ir.step import Op

from .mutations import drop_step, duplicate_reduce, set_peer
from .programs import ring_allgather, ring_allreduce, two_channel_allgather

HAND_WRITTEN = [ring_allgather, ring_allreduce, two_channel_allgather]


def _registered(nranks: int) -> list[Program]:
    programs = []
    for algo in algorithms.available():
        try:
            programs.append(algorithms.build(algo.collective, algo.name, nranks))
        except AlgorithmError:
            continue
    return programs


@st.composite
def programs(draw) -> Program:
    n = draw(st.integers(2, 9))
    candidates = [f(n) for f in HAND_WRITTEN] + _registered(n)
    return draw(st.sampled_from(candidates))


def _rejected(program: Program) -> bool:
    try:
        verify(program)
    except ProgramError:
        return True
    return False


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(programs(), st.data())
def test_dropping_any_step_is_rejected(program, data):
    verify(program)
    i = data.draw(st.integers(0, program.nsteps - 1))
    assert _rejected(drop_step(program, i)), f"dropping step {program.where(i)} went unnoticed"


@SETTINGS
@given(programs(), st.data())
def test_redirecting_a_message_is_rejected(program, data):
    t = program.table
    comm = np.flatnonzero(t.peer >= 0)
    i = int(data.draw(st.sampled_from(comm.tolist())))
    others = [p for p in range(program.nranks) if p not in (t.part[i], t.peer[i])]
    if not others:
        return
    peer = data.draw(st.sampled_from(others))
    assert _rejected(set_peer(program, i, peer))


@SETTINGS
@given(programs(), st.data())
def test_duplicating_a_reduction_is_rejected(program, data):
    t = program.table
    reduces = np.flatnonzero((t.op == Op.RECV_REDUCE) | (t.op == Op.REDUCE))
    if len(reduces) == 0:
        return
    i = int(data.draw(st.sampled_from(reduces.tolist())))
    assert _rejected(duplicate_reduce(program, i))
