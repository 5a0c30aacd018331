"""Reduce-scatter across boxes with partials bound for another box first: DGX A100 x2 with one
tree per root reaches the allgather's pace on every MSCCL-family target."""

from __future__ import annotations

import numpy as np
import pytest

from commflow import topology
from commflow.errors import AlgorithmError
from commflow.ir import Op, to_msccl_xml
from commflow.ir.verify import verify
from commflow.sim import simulate
from commflow.synth import synthesize, synthesize_for
from commflow.synth.cross_box import cross_box_first

from ..ir.msccl_conformance import violations

A100X2 = topology.load("dgx-a100x2")
SIZE = 1 << 30
ALLGATHER_PACE = 342.6383267597896e9  # the one-tree allgather (tests/synth/test_few_trees.py)


def test_local_channels_wait_for_the_last_partial_bound_for_the_other_box():
    program = synthesize("reducescatter", A100X2, trees=4, pieces=4)
    ordered = cross_box_first(program, A100X2)
    t, o = program.table, ordered.table
    for name in ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off"):
        assert np.array_equal(getattr(t, name), getattr(o, name))  # the same steps
    added = np.flatnonzero(np.diff(o.dep_ptr) != np.diff(t.dep_ptr))
    assert len(added) == 16 * 7  # every rank: one per channel of a root in its own box
    for i in added.tolist():
        gate = int(o.dep_idx[o.dep_ptr[i + 1] - 1])
        assert o.op[i] == o.op[gate] == int(Op.SEND) and o.part[i] == o.part[gate]
        assert o.peer[i] // 8 == o.part[i] // 8 == o.peer[gate] // 8  # NVLink hops
        assert o.src_off[i] // 4 // 8 == o.part[i] // 8 != o.src_off[gate] // 4 // 8
    verify(ordered)
    assert dict(ordered.params)["order"] == "cross-box first"


def test_the_order_gains_the_network_hop_on_every_target():
    program = synthesize("reducescatter", A100X2, trees=4, pieces=4)
    ordered = cross_box_first(program, A100X2)
    before = simulate(program, A100X2, SIZE, model="flow", target="msccl").algbw
    assert before == pytest.approx(25600e9 / 77, rel=1e-9)
    for runtime in ("msccl", "msccl-executor", "rccl"):
        verify(ordered, target=runtime)  # bounded buffers: no send blocks forever
        assert violations(to_msccl_xml(ordered, runtime), runtime) == []
        after = simulate(ordered, A100X2, SIZE, model="flow", target=runtime).algbw
        assert after == pytest.approx(ALLGATHER_PACE, rel=1e-9)
    unbounded = simulate(ordered, A100X2, SIZE, model="flow").algbw
    assert unbounded == pytest.approx(ALLGATHER_PACE, rel=1e-9)


def test_synthesize_for_takes_the_ordered_program_on_msccl():
    program, text = synthesize_for("reducescatter", A100X2, "msccl", pieces=(4,))
    assert dict(program.params)["order"] == "cross-box first"
    assert violations(text, "msccl") == []


def test_one_box_is_left_alone_and_other_collectives_are_refused():
    one_box = topology.load("dgx-a100")
    program = synthesize("reducescatter", one_box, pieces=2)
    assert cross_box_first(program, one_box) is program
    with pytest.raises(AlgorithmError, match="reduce-scatter partials, not allgather"):
        cross_box_first(synthesize("allgather", A100X2, trees=4, pieces=1), A100X2)
    with pytest.raises(AlgorithmError, match="8 ranks, topology dgx-a100x2 has 16"):
        cross_box_first(program, A100X2)
