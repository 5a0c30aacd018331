"""docs/scheduling.md: its Python example prints what the page shows, and its commands print
exactly the tables shown (the simulation is deterministic)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from commflow.cli import app

DOC = (Path(__file__).resolve().parents[2] / "docs" / "scheduling.md").read_text()


def test_the_python_example_prints_the_toy():
    code = re.search(r"```python\n(.*?)```", DOC, flags=re.DOTALL).group(1)
    shown = re.search(r"prints\n\n```text\n(.*?)```", DOC, flags=re.DOTALL).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    assert printed.getvalue() == shown


def test_the_commands_print_the_tables_shown():
    blocks = re.findall(r"```console\n(.*?)```", DOC, flags=re.DOTALL)
    assert blocks
    for block in blocks:
        command, *shown = block.rstrip("\n").split("\n")
        words = shlex.split(command.removeprefix("$ "))
        assert words[0] == "commflow"
        result = CliRunner().invoke(app, words[1:], terminal_width=80)
        assert result.exit_code == 0, result.output
        assert [line.rstrip() for line in result.output.rstrip("\n").split("\n")] == shown
