"""benchmarks/fused_ceiling.py (docs/benchmarks.md, "Fused steps would not bring MI250 x2
within 2%") runs and prints, per count of pieces, the fewest XML elements with every fusion
and the one-pass loss."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from commflow import topology
from commflow.ir.msccl_fit import least_elements
from commflow.synth import synthesize

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fused_ceiling.py"


def test_the_script_prints_each_count(capsys):
    spec = importlib.util.spec_from_file_location("fused_ceiling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._counts("3-5,8") == [3, 4, 5, 8]
    module.main("ring4", ["allgather:1-2"])
    header, *rows = capsys.readouterr().out.strip().split("\n")
    assert header.split()[:3] == ["collective", "pieces", "rank"]
    assert [r.split()[1] for r in rows] == ["1", "2"]
    ring = topology.load("ring4")
    for row in rows:
        words = row.split()
        least = least_elements(synthesize("allgather", ring, pieces=int(words[1])))
        assert (words[2], words[3]) == (f"{least.max():,}", f"{least.sum():,}")
        assert words[4:6] == ["yes", "yes"]
        assert abs(float(words[8])) < 0.1  # a ring keeps the default's algbw
