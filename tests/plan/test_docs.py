"""docs/planner.md: every ``commflow plan`` command of the worked examples prints exactly the
output the doc shows, and the timeline it draws is a PNG."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "planner.md"
DATA = Path(__file__).resolve().parent / "data"


def documented_runs() -> list[tuple[list[str], list[str]]]:
    """``(argv, output lines)`` of every ``$ commflow`` line of the console blocks."""
    runs = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        command, *output = block.rstrip("\n").splitlines()
        assert command.startswith("$ commflow ")
        runs.append((shlex.split(command[2:])[1:], output))
    return runs


def test_worked_example_output_is_current(commflow, tmp_path, monkeypatch):
    shutil.copytree(DATA, tmp_path / "tests" / "plan" / "data")  # run as from the repo root
    monkeypatch.chdir(tmp_path)
    runs = documented_runs()
    assert len(runs) == 5
    for argv, output in runs:
        run = commflow(*argv)
        assert run.code == 0, run.stderr
        assert run.stdout.rstrip("\n").splitlines() == output, argv
    assert (tmp_path / "planner-timeline.png").read_bytes()[:4] == b"\x89PNG"
