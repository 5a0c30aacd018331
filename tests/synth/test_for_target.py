"""Synthesis for a runtime: the fastest program the target loads, or a clear refusal."""

import pytest

from commflow import topology
from commflow.errors import AlgorithmError
from commflow.sim import lower_bound, simulate
from commflow.synth import synthesize, synthesize_for

SIZE = 1 << 30
DGX1 = topology.dgx1()


def _on(program, target: str) -> float:
    return simulate(program, DGX1, SIZE, model="flow", target=target).algbw


@pytest.mark.parametrize(("collective", "target", "pieces", "least"), [
    ("allgather", "msccl", (4, 2), 0.982),    # 2 pieces per tree: 168.4 of 171.4 GB/s
    ("allgather", "rccl", (8,), 0.986),       # 8 (rccl counts elements per rank): 169.1
    ("reducescatter", "msccl", (2, 1), 0.972),  # 1 piece: 166.8
    ("allreduce", "msccl", (2, 1), 0.964),    # 1 piece: 82.7 of 85.7 GB/s
])
def test_dgx1_programs_with_channels_by_depth_keep_most_of_the_bound(collective, target, pieces,
                                                                     least):  # fmt: skip
    program, xml = synthesize_for(collective, DGX1, target, pieces=pieces)
    assert dict(program.params)["levels"] == 8 and 'nchannels="1"' not in xml
    bound = lower_bound(collective, DGX1, SIZE).algbw
    assert least * bound < _on(program, target) <= bound * (1 + 1e-9)


def test_channels_by_depth_beat_one_stream_per_edge_on_the_target():
    # the same pieces, one stream per edge: each loop fills and drains the trees' pipeline
    leveled = _on(synthesize("allreduce", DGX1, pieces=2, levels=8), "msccl")
    streamed = _on(synthesize("allreduce", DGX1, pieces=2), "msccl")
    assert leveled > 1.06 * streamed


def test_nothing_fitting_is_refused_with_the_last_reason():
    with pytest.raises(AlgorithmError, match=r"fits rccl .* 64 per threadblock"):
        synthesize_for("allgather", DGX1, "rccl", pieces=(16,))
