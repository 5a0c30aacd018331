"""Synthesis for a runtime: the most pipelined program the target loads, or a clear refusal."""

import pytest

from commflow import topology
from commflow.errors import AlgorithmError
from commflow.sim import simulate
from commflow.synth import synthesize, synthesize_for


def test_dgx1_allgather_fits_msccl_with_four_pieces_and_loses_under_three_percent():
    topo = topology.dgx1()
    program, xml = synthesize_for("allgather", topo, "msccl")
    assert dict(program.params)["pieces"] == 4 and 'coll="allgather"' in xml
    default = simulate(synthesize("allgather", topo), topo, 1 << 30, model="flow").algbw
    lowered = simulate(program, topo, 1 << 30, model="flow", target="msccl").algbw
    assert 0.97 * default < lowered < default


def test_nothing_fitting_is_refused_with_the_last_reason():
    with pytest.raises(AlgorithmError, match=r"fits rccl .* 64 per threadblock"):
        synthesize_for("allgather", topology.dgx1(), "rccl", pieces=(16,))
