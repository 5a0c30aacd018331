"""benchmarks/export_targets.py (docs/benchmarks.md, "Synthesized programs on MSCCL targets")
runs and prints one row per collective and target; on a 4-rank ring every target keeps the
default synthesis' algbw."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from commflow import topology
from commflow.sim import lower_bound

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "export_targets.py"


def test_the_script_prints_every_collective_and_target(capsys):
    spec = importlib.util.spec_from_file_location("export_targets", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["ring4"])
    header, *rows = capsys.readouterr().out.strip().split("\n")
    assert header.split()[:3] == ["preset", "collective", "target"]
    seen = {(r.split()[1], r.split()[2]) for r in rows}
    assert seen == {(c, t) for c in module.COLLECTIVES for t in module.TARGETS}
    ring = topology.load("ring4")
    for row in rows:
        words = row.split()
        algbw, default, loss = float(words[-5]), float(words[-4]), float(words[-3])
        assert abs(loss) < 0.1 and algbw <= default * 1.001
        if words[3] == "-":  # trees: fully fused, at least the pieces it holds
            assert int(words[-2]) >= int(words[4])
        else:  # rings x chunks per ring: nothing to fuse further
            rings, chunks = (int(x) for x in words[3].split("x"))
            assert rings >= 1 and chunks in (1, 2) and words[-2] == "-"
        assert algbw * 1e9 <= lower_bound(words[1], ring, module.SIZE).algbw * 1.0001
