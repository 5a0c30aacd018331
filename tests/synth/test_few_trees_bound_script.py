"""benchmarks/few_trees_bound.py (docs/benchmarks.md, "What is left on MI250 x2") runs and
prints, per cap on trees per root, the busiest link against the optimum: on a ring of 4 one
tree per root loads some link 4/3 as much (12 tree edges on 8 links, so one carries 2 where
the optimum spreads 1.5), two trees reach the optimum."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "few_trees_bound.py"


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_the_script_prints_the_busiest_link_per_cap(capsys, collective):
    spec = importlib.util.spec_from_file_location("few_trees_bound", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main("ring4", collective, [1, 2], 10.0)
    title, header, *rows = capsys.readouterr().out.strip().split("\n")
    assert title.startswith(f"# ring4 {collective}:") and header.split()[:3] == [
        "trees/root", "busiest", "bound"]
    table = [row.split() for row in rows]
    assert [r[:3] for r in table] == [["1", "1.333", "1.333"], ["2", "1.000", "1.000"]]
