"""`commflow synth --xml`: the program the target loads, and what its limits cost."""

from __future__ import annotations

from tests.ir.msccl_conformance import violations


def test_cli_says_what_the_targets_limits_cost(commflow, tmp_path):
    run = commflow("synth", "allgather", "--topo", "dgx1", "-b", "1G", "-e", "1G",
                   "--xml", str(tmp_path / "ag.xml"))
    assert run.code == 0, run.stderr
    # DGX-1's six NVLink cycles as rings: 171.26 GB/s against the default's 171.13
    assert ("MSCCL XML for msccl: 6 rings of 2 chunks each, 1392 steps, 0.08% above the "
            "default synthesis at 1G (flow model)") in run.stderr
    assert violations((tmp_path / "ag.xml").read_text(), "msccl") == []


def test_cli_says_how_far_below_a_tree_program_runs(commflow, tmp_path):
    # two NDv2 boxes: a ring crosses their NICs twice (1.875x the bound), so trees win
    run = commflow("synth", "allgather", "--topo", "ndv2x2", "-b", "1M", "-e", "1M",
                   "--xml", str(tmp_path / "ag.xml"), "--target", "rccl")
    assert run.code == 0, run.stderr
    assert ("MSCCL XML for rccl: 128 pieces per tree, merge 2:3, split 60, 22816 steps, 0.06% "
            "below the default synthesis at 1G (flow model)") in run.stderr
    assert violations((tmp_path / "ag.xml").read_text(), "rccl") == []
