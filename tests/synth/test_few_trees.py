"""Packings with few trees per root: DGX A100 x2 has an exact one with one tree per root, whose
programs fit every MSCCL-family runtime (13 trees per root fit none)."""

from __future__ import annotations

import pytest

from commflow import topology
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import to_msccl_xml
from commflow.sim import lower_bound, simulate
from commflow.synth import synthesize, synthesize_for

from ..ir.msccl_conformance import violations

A100X2 = topology.load("dgx-a100x2")
SIZE = 1 << 30
RUNTIMES = ("msccl", "msccl-executor", "rccl")


@pytest.mark.parametrize(("collective", "steps", "algbw"), [
    ("allgather", 16 * (2 * 15 + 1), 342.6383267597896e9),  # a send and receive per edge, a copy
    ("reducescatter", 16 * 2 * 15, 25600e9 / 77),
    ("allreduce", 16 * 4 * 15, 171.37384994223436e9),
])
def test_one_tree_per_root_fits_every_runtime(collective, steps, algbw):
    program = synthesize(collective, A100X2, trees=4, pieces=1)
    params = dict(program.params)
    assert (params["units"], params["packing"]) == (1, "forest")  # exact: one tree per root
    assert program.nsteps == steps
    for runtime in RUNTIMES:  # verified on each (bounded buffers) and within its rules
        assert violations(to_msccl_xml(program, runtime), runtime) == []
    on_msccl = simulate(program, A100X2, SIZE, model="flow", target="msccl").algbw
    assert on_msccl == pytest.approx(algbw, rel=1e-9)
    assert on_msccl < lower_bound(collective, A100X2, SIZE).algbw


def test_the_default_packing_fits_no_runtime_and_synthesize_for_takes_one_tree():
    default = synthesize("allgather", A100X2, pieces=1)
    assert dict(default.params)["units"] == 13 and default.nsteps == 16 * 13 * 31
    for runtime in RUNTIMES:
        with pytest.raises(ProgramError, match="threadblocks|elements per file|depid"):
            to_msccl_xml(default, runtime)
    program, text = synthesize_for("allgather", A100X2, "rccl", pieces=(1,))
    assert dict(program.params)["units"] == 1 and violations(text, "rccl") == []


def test_trees_below_one_are_refused():
    with pytest.raises(AlgorithmError, match="trees must be >= 1, got 0"):
        synthesize("allgather", A100X2, trees=0)
