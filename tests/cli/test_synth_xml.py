"""`commflow synth --xml`: the program the target loads, and what its limits cost."""

from __future__ import annotations

from tests.ir.msccl_conformance import violations


def test_cli_says_what_the_targets_limits_cost(commflow, tmp_path):
    run = commflow("synth", "allgather", "--topo", "dgx1", "-b", "1G", "-e", "1G",
                   "--xml", str(tmp_path / "ag.xml"))
    assert run.code == 0, run.stderr
    # 2 pieces per tree, channels by depth: 168.37 GB/s against the default's 171.13
    assert ("MSCCL XML for msccl: 2 piece(s) per share, 8 channels per edge by depth, 1440 "
            "steps, 1.61% below the default synthesis at 1G (flow model)") in run.stderr
    assert violations((tmp_path / "ag.xml").read_text(), "msccl") == []
